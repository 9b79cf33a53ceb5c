"""What the host programs are built from: the stage lifecycle, preflight, the one server switch, the
extraction swap and its plan, the server lock, GPU owners, the verifier's description, the disk
survey and small readers. It imports the contract and itself, never a program or the drafter."""
