#!/usr/bin/env bash
# Global verification of this product repo, run by the factory harness before acceptance.
set -euo pipefail
python -m compileall -q calc.py
python -m pytest -q -p no:cacheprovider
