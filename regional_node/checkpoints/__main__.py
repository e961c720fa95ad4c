"""`python -m regional_node.checkpoints init OUT_DIR --arch llama --size tiny`."""

import sys

from regional_node.checkpoints.cli import model_init_main

if __name__ == "__main__":
    sys.exit(model_init_main(sys.argv[1:]))
