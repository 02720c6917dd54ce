"""Start rayless on this node, torchrun-style (``rayless.actors.launch.node``; ``rayless launch``).

    python scripts/launch.py --nnodes 2 --node-rank 0 --master-addr HOST --master-port 29400 \\
        --token-file ~/.rayless/job.token -- train.py --lr 1e-4
"""

import sys

from rayless.actors.launch.node import main

if __name__ == "__main__":
    sys.exit(main())
