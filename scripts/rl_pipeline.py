"""The end-to-end RL pipeline (``rayless demo``): see rayless/demo/main.py for the options.

python scripts/rl_pipeline.py [--config rayless/configs/default.yaml] [--mode async]
python scripts/rl_pipeline.py --config grpo        # the GRPO demo (rayless/configs/grpo.yaml)
python scripts/launch.py --nnodes 2 --node-rank 0 ... -- scripts/rl_pipeline.py
"""

import sys

from rayless.demo.main import main

if __name__ == "__main__":
    sys.exit(main())
