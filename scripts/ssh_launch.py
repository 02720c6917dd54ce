"""Start rayless on many hosts over SSH (see ``actors.ssh_launch``; also ``rayless ssh-launch``).

python scripts/ssh_launch.py --hosts gpu1,gpu2 --workdir /shared/proj -- train.py --lr 1e-4
"""

import sys

from rayless.actors.launch.ssh import main

if __name__ == "__main__":
    sys.exit(main())
