"""The train stage: input run -> checks -> run directory -> preflight -> speculators training -> summary.

Order matters for "bad input loses nothing": the input run, the verifier, the aux layer ids and the
hidden states are checked before the run directory is touched; a run directory holding another run
(different identity) or another verifier's checkpoints is refused, never overwritten.

Resume: the same command again (same identity) continues from the newest checkpoint (speculators'
own resume: epoch dir + training_state.json). The worker writes a `resume` event naming the step it
continues from, so progress events of steps redone after a kill -9 are superseded, not counted twice.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

from backend.contract import exitcodes
from backend.contract.lookup import CompletedRun, InputError, completed_run, latest_completed
from backend.contract.runs import Manifest, RunDir, read_manifest, run_path
from backend.drafter import checkpoints as ck
from backend.drafter.verifier import VerifierError, VerifierInfo, check_layer_ids, inspect_verifier
from backend.kit.lifecycle import StageFailed, StageRun, Stopped, refuse
from backend.kit.swap import ExtractionServer, SwapFailed, SwapStopped, describe, run_swapped_blocking
from backend.kit.swap_plan import PlanError, SwapPlan, check_server_layers, load_plan
from backend.train import launch
from backend.kit.hostfacts import check_host
from backend.train import preflight as pf
from backend.train.config import ConfigError, TrainStageConfig, resolved_dtype
from backend.train.plan import CHECKPOINTS_DIR, VOCAB_DIR, TrainPlan, read_status, speculators_argv
from backend.train.vocab import VocabChoice
from backend.train.warm_start import WarmStart, WarmStartError

STAGE = "train"


class UsageError(Exception):
    """Bad input found before the run directory was touched (exit 2, one line)."""


def _aux_ids_of(run: CompletedRun) -> list[int] | None:
    for key in ("aux_layer_ids", "layer_ids"):
        value = run.summary.get(key)
        if isinstance(value, list) and all(isinstance(v, int) for v in value):
            return list(value)
    return None


def resolve_input(c: TrainStageConfig) -> CompletedRun:
    """The extract run (offline) or prepare run (online) the stage trains on."""
    if c.input_run is None:
        return latest_completed(c.work_dir, "prepare" if c.online else "extract")
    manifest = read_manifest(run_path(c.work_dir, c.input_run)) if os.path.isdir(
        run_path(c.work_dir, c.input_run)) else None
    stage = manifest.stage if manifest else ("prepare" if c.online else "extract")
    if stage == "prepare" and not c.online:
        raise InputError(f"prepare run {c.input_run} has no hidden states: run extract on it first, or train "
                         f"online with --vllm-endpoint (an extraction server)")
    if stage not in ("extract", "prepare"):
        raise InputError(f"run {c.input_run!r} is a {stage} run; train takes an extract run (or a prepare run "
                         f"with --vllm-endpoint)")
    return completed_run(c.work_dir, c.input_run, stage)


def _existing_dir(run: CompletedRun, name: str) -> str:
    path = run.output(name)
    if not os.path.isdir(path):
        raise InputError(f"{run.stage} run {run.run_id}: its output {name} ({path}) is missing on this host")
    return path


class Inputs:
    def __init__(self, c: TrainStageConfig):
        self.run = resolve_input(c)
        self.info = inspect_verifier(c.verifier)
        recorded = _aux_ids_of(self.run)
        if c.aux_layer_ids is not None and recorded is not None and c.aux_layer_ids != recorded:
            raise UsageError(f"--aux-layer-ids {c.aux_layer_ids} differ from the ids {recorded} the hidden states "
                             f"of {self.run.stage} run {self.run.run_id} were extracted with")
        self.layer_ids = c.aux_layer_ids if c.aux_layer_ids is not None else recorded
        if self.layer_ids is None:
            raise UsageError(f"{self.run.stage} run {self.run.run_id} does not say which aux layer ids it used: "
                             f"pass --aux-layer-ids")
        check_layer_ids(self.info, self.layer_ids)
        self.train_data = _existing_dir(self.run, "train_data")
        self.heldout_data = self.run.outputs.get("heldout_data")
        self.token_freq = self.run.outputs.get("token_freq")
        self.train_hs = None if c.online else _existing_dir(self.run, "train_hidden_states")
        self.heldout_hs = self.run.outputs.get("heldout_hidden_states")
        if self.train_hs is not None and not any(n.startswith("hs_") for n in os.listdir(self.train_hs)):
            raise InputError(f"{self.run.stage} run {self.run.run_id}: {self.train_hs} holds no hs_*.safetensors")
        self.warm: WarmStart | None = None
        if c.from_pretrained is not None:
            from backend.train import warm_start

            self.warm = warm_start.check_fit(c.from_pretrained, warm_start.resolve(c.work_dir, c.from_pretrained),
                                             self.info, self.layer_ids, c.draft_vocab_size)
        elif c.draft_vocab_size is not None and c.draft_vocab_size < self.info.vocab_size:
            if not self.token_freq or not os.path.exists(self.token_freq):
                raise InputError(f"a draft vocabulary of {c.draft_vocab_size} needs the token frequencies of "
                                 f"{self.run.stage} run {self.run.run_id} (its token_freq output is missing)")
        self.vocab = choose_vocab(c, self)
        if self.warm is None and c.draft_vocab_size is None and not self.vocab.full:
            c.draft_vocab_size = self.vocab.size  # the run's identity and speculators' flags carry the size


def choose_vocab(c: TrainStageConfig, inputs: "Inputs") -> "VocabChoice":
    """The draft vocabulary and its coverage of the prepare run's supervised tokens (backend/train/vocab.py)."""
    from backend.train import vocab as vb

    freq = None
    if inputs.token_freq and os.path.exists(inputs.token_freq):
        try:
            freq = vb.load_freq(inputs.token_freq)
            vb.counts(freq)
        except Exception as exc:  # torch raises its own kinds for a damaged file
            raise InputError(f"{inputs.run.stage} run {inputs.run.run_id}: its token frequencies "
                             f"{inputs.token_freq} are unreadable ({exc})") from None
    vocab = inputs.info.vocab_size
    if inputs.warm is not None:
        ranked = vb.counts(freq) if freq is not None else None
        return vb.VocabChoice(size=inputs.warm.draft_vocab_size, vocab=vocab, chosen_by="warm start",
                              coverage=vb.covered(ranked, inputs.warm.draft_vocab_size) if ranked else None)
    if c.draft_vocab_size is not None:
        return vb.given(freq, vocab, c.draft_vocab_size)
    if freq is None or not freq:
        return vb.VocabChoice(size=vocab, vocab=vocab, coverage=None, chosen_by="no token frequencies")
    return vb.by_coverage(freq, vocab, c.vocab_coverage, c.vocab_floor)


def identity_of(c: TrainStageConfig, inputs: Inputs, cpu: bool) -> dict[str, Any]:
    """What makes two train runs the same run: changing any of these refuses a resume (the dtype as it
    resolves, so a run started with an explicit bfloat16 on GPUs resumes under auto)."""
    return {"input_run": inputs.run.run_id, "input_stage": inputs.run.stage, "verifier": inputs.info.path,
            "verifier_fingerprint": inputs.info.fingerprint, "aux_layer_ids": inputs.layer_ids,
            "epochs": c.epochs, "lr": c.lr, "speculative_tokens": c.speculative_tokens,
            "draft_vocab_size": c.draft_vocab_size, "seq_length": c.seq_length, "draft_layers": c.draft_layers,
            "optimizer": c.optimizer, "seed": c.seed,
            "hidden_states_dtype": resolved_dtype(c.hidden_states_dtype, cpu),
            "train_data_ratio": c.train_data_ratio, "max_steps": c.max_steps, "online": c.online,
            "extra_args": c.extra_args,
            **({"from_pretrained": inputs.warm.checkpoint} if inputs.warm else {})}


def on_cpu(c: TrainStageConfig, processes: int) -> bool:
    return processes == 0 or c.simulated_gpus  # simulated GPUs are checked, never computed on


def gpu_count() -> int:
    """GPUs torch sees (0 without torch: the preflight's module check then says how to install it)."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def simulated_gpu_count() -> int:
    """The demo host's GPUs, as its nvidia-smi lists them (0 when it cannot say)."""
    try:
        return len(pf.parse_gpu_uuids(pf._nvidia_smi("--query-gpu=index,uuid", "--format=csv,noheader")))
    except (OSError, subprocess.TimeoutExpired):
        return 0


def processes_for(c: TrainStageConfig, available: int) -> int:
    """GPU processes to start (0: the CPU)."""
    return available if c.gpus is None else c.gpus


def vocab_files(c: TrainStageConfig, inputs: Inputs, run_dir: str) -> tuple[int, str, str] | None:
    """The reduced draft vocabulary as speculators' d2t/t2d files, built in the run dir (speculators would
    write them beside the input data, in another run's directory)."""
    size = c.draft_vocab_size
    if inputs.warm is not None or size is None or size >= inputs.info.vocab_size:
        return None
    import numpy as np
    import torch
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    out = os.path.join(run_dir, VOCAB_DIR)
    d2t_path, t2d_path = os.path.join(out, f"d2t-{size}.npy"), os.path.join(out, f"t2d-{size}.npy")
    if not (os.path.exists(d2t_path) and os.path.exists(t2d_path)):
        os.makedirs(out, exist_ok=True)
        freq = torch.load(inputs.token_freq, weights_only=True)
        d2t, t2d = build_vocab_mappings_from_distribution(freq, size, inputs.info.vocab_size)
        for path, array in ((d2t_path, d2t), (t2d_path, t2d)):
            with open(path + ".tmp", "wb") as f:
                np.save(f, array.cpu().numpy())
            os.replace(path + ".tmp", path)
    return size, d2t_path, t2d_path


def estimate_checkpoint_bytes(c: TrainStageConfig, info: VerifierInfo, layers: int) -> int:
    h = info.hidden_size
    vocab = c.draft_vocab_size or info.vocab_size
    trainable = c.draft_layers * (8 * h * h + 3 * h * (4 * h)) + layers * h * h
    params = trainable + info.vocab_size * h + vocab * h
    saves = c.epochs if c.checkpoint_freq <= 1 else max(1, int(c.epochs // c.checkpoint_freq))
    return pf.checkpoint_bytes(params, trainable, saves + 1)


def selection_settings(c: TrainStageConfig, inputs: Inputs) -> dict[str, Any] | None:
    """What the trainer measures each checkpoint on (backend/train/selection.py); None: nothing to measure."""
    from backend.train.selection import SelectionSettings

    if c.acceptance_samples < 1 or not inputs.heldout_data or not inputs.heldout_hs:
        return None
    if not (os.path.isdir(inputs.heldout_data) and os.path.isdir(inputs.heldout_hs)):
        return None
    return SelectionSettings(samples=c.acceptance_samples, k=c.speculative_tokens, patience=c.acceptance_patience,
                             min_delta=c.acceptance_min_delta, heldout_data=inputs.heldout_data,
                             heldout_hidden_states=inputs.heldout_hs).to_dict()


class Stage:
    def __init__(self, config: TrainStageConfig):
        self.c = config
        self.ctx: StageRun | None = None
        self.phase = "setup"
        self.stop = False
        self.child: subprocess.Popen | None = None
        self.swap_plan: SwapPlan | None = None
        self.server: ExtractionServer | None = None
        self.lost: str | None = None  # why the extraction server died during online training

    def use_plan(self) -> None:
        """Online under the swap: the plan gives the endpoint and (when not given) the aux layer ids its
        extraction server was started with; ids that differ from it are refused."""
        c = self.c
        if c.plan is None:
            return
        try:
            plan = load_plan(c.plan)
        except PlanError as exc:
            raise UsageError(str(exc)) from None
        if c.aux_layer_ids is not None and c.aux_layer_ids != plan.aux_layer_ids:
            raise UsageError(f"--aux-layer-ids {c.aux_layer_ids} differ from the ids {plan.aux_layer_ids} the "
                             f"plan starts the extraction server with")
        c.aux_layer_ids = list(plan.aux_layer_ids)
        c.vllm_endpoint = c.vllm_endpoint or f"{plan.endpoint}/v1"
        self.swap_plan = plan

    def swap_progress(self, phase: str, force: bool = False, **extra: Any) -> None:
        """The swap's steps as progress events (their `step` is a name, never a training step)."""
        self.emit("progress", phase=phase, **extra)

    def server_lost(self, reason: str) -> None:
        """The watchdog's call (another thread): stop training now, say why at the end."""
        self.lost = reason
        self.stop = True
        if self.child is not None:
            _signal_workers(self.child.pid, signal.SIGTERM)

    def emit(self, kind: str, **data: Any) -> None:
        if self.ctx is not None:
            self.ctx.emit(kind, **data)  # backend/kit/lifecycle.py: never takes the run down
        elif kind == "error":
            print(f"train: error: {data.get('message')}", file=sys.stderr)

    def _on_stop(self, name: str) -> None:
        """Before training: the lifecycle raises Stopped where the setup is (nothing to save). Training:
        the workers save a resumable checkpoint and exit."""
        self.stop = True
        if self.child is not None:
            _signal_workers(self.child.pid, getattr(signal, name))

    def preflight(self, inputs: Inputs, processes: int, available: int, where: str) -> pf.PreflightReport:
        """Online, the GPU check waits for the swap-in (the baseline holds the GPUs until then): see _run."""
        report = pf.PreflightReport()
        pf.check_modules(report)
        check_host(report, list(self.c.nvidia_smi) if self.c.nvidia_smi else None)  # warnings only
        if self.swap_plan is None:
            pf.check_gpus(report, processes, available)
        pf.check_disk(report, where, estimate_checkpoint_bytes(self.c, inputs.info, len(inputs.layer_ids))
                      + self.c.min_free_bytes, self.c.work_dir,
                      uses=(inputs.run.run_id, *((inputs.warm.checkpoint,) if inputs.warm else ())))
        return report

    def run(self) -> int:
        c = self.c
        try:
            self.use_plan()
            inputs = Inputs(c)
            if self.swap_plan is not None:  # online: its server must write the states speculators reads
                check_server_layers(self.swap_plan, inputs.info)
        except (InputError, VerifierError, UsageError, ConfigError, PlanError, WarmStartError) as exc:
            return refuse("train", exc)
        if c.nvidia_smi:
            pf.NVIDIA_SMI = list(c.nvidia_smi)
            from backend.kit import hostfacts
            hostfacts.NVIDIA_SMI = list(c.nvidia_smi)
        available = simulated_gpu_count() if c.simulated_gpus else gpu_count()
        processes = processes_for(c, available)
        if c.preflight_only:
            report = self.preflight(inputs, processes, available, run_path(c.work_dir, c.run_id))
            print(json.dumps(report.to_dict(), indent=2))
            return exitcodes.COMPLETED if report.ok else exitcodes.FAILED
        manifest = Manifest(stage=STAGE, run_id=c.run_id, identity=identity_of(c, inputs, on_cpu(c, processes)),
                            settings={"gpus": processes, "vllm_endpoint": c.vllm_endpoint, "plan": c.plan,
                                      "served_model": c.served_model,
                                      "checkpoint_freq": c.checkpoint_freq, "log_freq": c.log_freq,
                                      "num_workers": c.num_workers, "acceptance_samples": c.acceptance_samples,
                                      "acceptance_patience": c.acceptance_patience,
                                      "acceptance_min_delta": c.acceptance_min_delta})
        save_path = os.path.join(run_path(c.work_dir, c.run_id), CHECKPOINTS_DIR)
        try:
            if not c.fresh:
                ck.check_save_root(save_path, inputs.info)
        except ck.CheckpointError as exc:
            return refuse("train", exc)
        # a stop before training raises Stopped where the setup is (nothing to save); from training on the
        # workers are told and save a resumable checkpoint (mode "flag", set in _run)
        ctx = self.ctx = StageRun(STAGE, c.run_id, work_dir=c.work_dir, manifest=manifest, fresh=c.fresh,
                                  mode="raise", failures=(SwapFailed,), stops=(SwapStopped,))
        ctx.on_stop(self._on_stop)
        if self.swap_plan is not None:  # provenance: online, the extraction server it trains against
            ctx.server_command = self.swap_plan.extractor.command or None
        self.outcome: dict[str, Any] = {}
        ctx.summarize = lambda status, error: self._summary(ctx.run_dir, inputs, save_path, status, error)
        return ctx.run(lambda ctx: self._run(ctx.run_dir, inputs, processes, available, save_path))

    def _run(self, run_dir: RunDir, inputs: Inputs, processes: int, available: int, save_path: str) -> None:
        c = self.c
        assert self.ctx is not None
        if not c.skip_preflight:
            report = self.preflight(inputs, processes, available, run_dir.path)
            if not report.ok:
                self.outcome["preflight"] = report.to_dict()
                raise StageFailed(f"preflight failed: {report.failures()}")
            for warning in report.warnings():  # the host's integrity: said, never a refusal
                self.emit("error", fatal=False, message=f"warning: {warning}")
        for repair in ck.recover_interrupted_save(save_path):  # under the run's lock: no live save to touch
            print(f"train: {repair}", file=sys.stderr)
            self.emit("progress", phase="recovered", message=repair)
        ck.mark_save_root(save_path, inputs.info)
        vocab = vocab_files(c, inputs, run_dir.path)
        staged = None
        if inputs.warm is not None:
            from backend.train import warm_start

            staged = warm_start.stage(inputs.warm, run_dir.path, inputs.info)
        cpu = on_cpu(c, processes)
        workers = c.num_workers if c.num_workers is not None else (0 if cpu else 4)
        plan = TrainPlan(run_id=c.run_id, run_dir=run_dir.path, events_path=run_dir.events_path,
                         verifier=inputs.info.path, save_path=save_path, processes=max(1, processes),
                         device="cpu" if cpu else "gpu", served_model=c.served_model,
                         argv=speculators_argv(c, train_data=inputs.train_data, hidden_states=inputs.train_hs,
                                               save_path=save_path, layer_ids=inputs.layer_ids, vocab=vocab,
                                               remote_code=self._remote_code(inputs.info), cpu=cpu,
                                               num_workers=workers, log_dir=os.path.join(run_dir.path, "logs"),
                                               cache_dir=os.path.join(run_dir.path, "hs-cache"),
                                               warm_start=staged))
        plan.selection = selection_settings(c, inputs)
        plan_path = plan.save()
        print(f"train: {inputs.vocab.describe()}", file=sys.stderr)
        self.ctx.checkpoint = inputs.info.path  # the verifier it trains against: its hash in the host facts
        self.ctx.start(total=0, processes=plan.processes, device=plan.device, verifier=inputs.info.to_dict(),
                       aux_layer_ids=inputs.layer_ids, input_run=inputs.run.run_id, draft_vocab=inputs.vocab.to_dict())
        try:
            os.remove(os.path.join(run_dir.path, "train_status.json"))
        except FileNotFoundError:
            pass
        with self.ctx.shielded():  # from here a stop is the workers' to act on: they save and exit
            self.ctx.mode = "flag"
            self.phase = "training"
        if self.stop:
            raise Stopped("stop")

        def body() -> str | None:
            if self.swap_plan is not None and not c.skip_preflight:
                # online: the baseline is down now, the extraction server up: the trainer's GPUs must be free
                gpus = pf.PreflightReport()
                pf.check_gpus(gpus, processes, available)
                if not gpus.ok:
                    return f"preflight after the swap-in failed: {gpus.failures()}"
            if plan.processes == 1:
                from backend.train.worker import train
                train(plan, stop_check=lambda: self.stop)
                return None
            return self._torchrun(plan, plan_path)

        error = None
        try:
            if self.swap_plan is None:
                error = body()
            else:
                self.server = ExtractionServer(self.swap_plan, progress=self.swap_progress, emit=self.emit,
                                               stopped=lambda: self.stop, ready_phase="training")
                error = run_swapped_blocking(self.server, body, self.server_lost)
        except (SwapStopped, SwapFailed):
            raise
        except Exception as exc:  # the worker's failure is the stage's reason
            error = f"{type(exc).__name__}: {exc}"
        self.phase = "finishing"
        status_file = read_status(run_dir.path) or {}
        status = status_file.get("status") if error is None else "failed"
        if self.lost is not None:
            step = status_file.get("global_step")
            raise StageFailed(f"the extraction server died midway ({f'at step {step}' if step else 'training'}"
                              f"): {self.lost}. Start the run again to resume from the last checkpoint")
        if status == "stopped":
            raise Stopped("stop")
        if status != "completed":
            raise StageFailed(error or "training ended without a status (the worker died)")

    def _remote_code(self, info: VerifierInfo) -> bool:
        return {"auto": info.remote_code, "on": True, "off": False}[self.c.trust_remote_code]

    def _torchrun(self, plan: TrainPlan, plan_path: str) -> str | None:
        env = dict(os.environ)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env[launch.PARENT_ENV] = str(os.getpid())  # torchrun and its ranks die with this process
        lock = self.ctx.lock if self.ctx is not None else None
        env.update(lock.child_env() if lock is not None else {})
        cmd = [sys.executable, "-m", "backend.train.launch", "--standalone", f"--nproc-per-node={plan.processes}",
               "-m", "backend.train.worker", plan_path]
        # torchrun keeps the run locked (the inherited lock descriptor) until it and its ranks are gone
        self.child = subprocess.Popen(cmd, env=env, pass_fds=lock.pass_fds() if lock is not None else ())
        while True:
            try:
                code = self.child.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                continue
        return None if code == 0 else f"torchrun exited {code} (see the lines above for the failing rank)"

    def _summary(self, run_dir: RunDir | None, inputs: Inputs, save_path: str, status: str,
                 error: str | None) -> dict[str, Any]:
        from backend.train import selection

        assert run_dir is not None
        best = selection.chosen_checkpoint(save_path) or ck.best_checkpoint(save_path)
        loss_best = ck.loss_best_epoch(save_path)
        state = read_status(run_dir.path) or {}
        outputs = {"checkpoints": save_path, "checkpoint": best, "heldout_data": inputs.heldout_data,
                   "heldout_hidden_states": inputs.heldout_hs, "token_freq": inputs.token_freq,
                   "train_data": inputs.train_data}
        summary: dict[str, Any] = {"stage": STAGE, "run_id": self.c.run_id, "status": status,
                                   "outputs": {k: v for k, v in outputs.items() if v},
                                   "verifier": inputs.info.path, "aux_layer_ids": inputs.layer_ids,
                                   "speculative_tokens": self.c.speculative_tokens,
                                   "draft_vocab_size": (inputs.warm.draft_vocab_size if inputs.warm else
                                                        self.c.draft_vocab_size or inputs.info.vocab_size),
                                   "epochs": self.c.epochs, "steps": state.get("global_step"),
                                   "done": state.get("global_step") or 0,
                                   "checkpoint_epochs": ck.epoch_dirs(save_path), "online": self.c.online,
                                   "vllm_endpoint": self.c.vllm_endpoint, **self.outcome}
        if inputs.warm is not None:
            summary["warm_start"] = inputs.warm.to_dict()
        summary["draft_vocab"] = {**inputs.vocab.to_dict(), "text": inputs.vocab.describe()}
        summary["selection"] = selection.describe(selection.read(save_path), loss_best) or {
            "by": "validation loss", "epoch": loss_best, "why": "no held-out acceptance was measured (online "
            "training, no held-out hidden states, or --acceptance-samples 0): speculators' lowest validation loss"}
        summary["stopped_early"] = bool(state.get("stopped_early"))
        if self.server is not None:
            summary["swap"] = self.server.record.to_dict()
        if status == "completed":
            summary["total"] = summary["done"]
        if status == "completed" and best is None:
            status, error = "failed", "training finished but left no checkpoint"
            summary["status"] = status
        if error:
            summary["error"] = error
        print(f"train: {status}" + (f": {error}" if error else f"; checkpoint {best}" if status == "completed" else ""),
              file=sys.stderr)
        if self.server is not None:
            print(f"train: {describe(summary['swap'])}", file=sys.stderr)
        return summary


def _signal_workers(pid: int, signum: int) -> None:
    """Signal torchrun's workers directly (they save and exit 0; torchrun then exits by itself)."""
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 1 and fields[1] == str(pid):
            children.append(int(entry))
    for child in children or [pid]:
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

