#!/usr/bin/env bash
# The GPU bundle's one command (tools/gpu_bundle.py copies it in as run.sh), run from the repository's root:
#   bash gpu-bundle/run.sh [bench/gpu_check.py arguments]       PYTHON=python3 SITE=/tmp/rope-extend-site
# 1. pip installs requirements.txt from wheels/ without an index into $SITE: what the environment already has at a
#    version the project accepts stays, the rest comes from the bundle (the image's site-packages is not written);
# 2. $SITE's site-packages goes on PYTHONPATH;
# 3. the demo model's parts, if the bundle has them, are joined into rope-extend's cache and checked (sha256);
# 4. bench/gpu_check.py runs with the arguments given.
set -euo pipefail
bundle="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python3}"
site="${SITE:-/tmp/rope-extend-site}"
if [ ! -f bench/gpu_check.py ]; then
    echo "run.sh: run it from the repository's root (no bench/gpu_check.py in $PWD)" >&2
    exit 2
fi
started=$(date +%s)
mkdir -p "$site"
PYTHONPATH="${PYTHONPATH:-}"
"$python" -m pip install --quiet --disable-pip-version-check --no-input --no-index --find-links "$bundle/wheels" \
    --prefix "$site" --no-warn-script-location -r "$bundle/requirements.txt"
for packages in $(find "$site" -type d \( -name site-packages -o -name dist-packages \)); do
    PYTHONPATH="$packages${PYTHONPATH:+:$PYTHONPATH}"
done
export PYTHONPATH
echo "run.sh: installed into $site in $(( $(date +%s) - started )) s (PYTHONPATH=$PYTHONPATH)"
if [ -f "$bundle/model/SHA256SUMS" ]; then
    read -r _ name < "$bundle/model/SHA256SUMS"
    cache="${ROPE_EXTEND_CACHE:-$HOME/.cache/rope-extend}/smollm2-135m-instruct-gguf"
    if ls "$bundle/model/$name".part-* > /dev/null 2>&1; then
        mkdir -p "$cache"
        cat "$bundle/model/$name".part-* > "$cache/.$name.joining"
        (cd "$cache" && mv ".$name.joining" "$name" && sha256sum --check --quiet "$bundle/model/SHA256SUMS") || {
            echo "run.sh: the model's parts in $bundle/model do not join to the file SHA256SUMS names" >&2
            rm -f "$cache/$name"
            exit 2
        }
        echo "run.sh: demo model's GGUF joined into $cache"
    fi
fi
exec "$python" bench/gpu_check.py "$@"
