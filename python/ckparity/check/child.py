"""python -m ckparity.check.child REQUEST: ckparity check's child process
(check/isolation.py): REQUEST is the JSON the parent wrote."""

import json
import sys

from .isolation import child

if __name__ == "__main__":
    sys.exit(child(json.loads(sys.argv[1])))
