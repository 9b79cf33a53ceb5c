"""What train and verify share: the verifier's layers as the drafter sees them, the CPU adapters,
checkpoints and their checks, the draft, acceptance and the held-out samples. It imports the
contract and the kit, never a program (neither train nor verify)."""
