# Sourced by the scripts: where the cache, the shared folder and the cargo target folder are.
# The cargo target folder lives in the cache, outside the clone, so CI and every checkout reuse one build.
export QUANTFARM_CACHE=${QUANTFARM_CACHE:-$HOME/.cache/quantfarm}
export QUANTFARM_SHARED=${QUANTFARM_SHARED:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/shared}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$QUANTFARM_CACHE/cargo-target}
mkdir -p "$QUANTFARM_CACHE"
