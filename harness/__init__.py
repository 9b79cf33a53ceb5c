"""What tests/ and benchmarks/ share: the vLLM stand-in's process harness, the fake controller, the tiny
drafter and training kits, and the test rig (an OpenSSH sshd on loopback, a booted systemd host).

Not shipped (the wheel holds console, backend and sim) and not under tests/: a benchmark imports it
without pytest installed. Nothing here imports pytest at module level.
"""
