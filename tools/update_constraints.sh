#!/usr/bin/env bash
# Regenerates constraints.txt, the versions CI installs (every package, transitive ones included):
# a fresh virtualenv gets modeldsl's test and distributed extras at the newest versions pyproject.toml allows, then
# its `pip freeze` becomes the file. Run it, then the whole suite (bash .ci/run), before committing
# the new file.
#
#   bash tools/update_constraints.sh            # writes constraints.txt at the repository root
set -euo pipefail
cd "$(dirname "$0")/.."

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet --upgrade pip
"$work/venv/bin/python" -m pip install --quiet -e ".[test,distributed]"
{
    echo "# The versions CI installs (bash .ci/run), tested together; regenerate with"
    echo "# bash tools/update_constraints.sh ($("$work/venv/bin/python" -c 'import sys; print("Python", sys.version.split()[0])'), $(date -u +%Y-%m-%d))."
    "$work/venv/bin/python" -m pip freeze --exclude-editable --all | grep -v '^modeldsl' | LC_ALL=C sort -f
} > constraints.txt.new
mv constraints.txt.new constraints.txt
echo "wrote constraints.txt ($(grep -cv '^#' constraints.txt) packages)"
