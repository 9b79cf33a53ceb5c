"""A pipeline run on the host: the stage programs one after another, detached from any console.

`python -m backend.chain --work-dir W --run-id ID --plan PLAN.json` runs the plan's stages in order,
each its own program with its own run directory (`<chain id>-<stage>`), each consuming the one before it.
The chain keeps a run directory of its own (stage "pipeline") whose events say which stage runs; it
stops at the first stage that does not complete, with that stage's reason, and started again with the
same run id it skips the stages that completed and resumes the one that stopped (each stage resumes
itself). SIGTERM goes to the running stage, which stops cleanly, and the chain says "stopped".

The plan is built by the console from the profile (console/control/pipeline.py): the host side only
runs argument lists, so no profile knowledge lives here.
"""
