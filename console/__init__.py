"""The operator's side of eagle3-console."""
import warnings

# cryptography 51 deprecates DSA and warns when asyncssh (which still names the DSA key types) is imported:
# a library's notice to its developers, printed on every command's stderr, where the operator and scripts
# read our own errors
warnings.filterwarnings("ignore", message="DSA is deprecated", module="asyncssh")
