# Sourced by bench/compare*.sh: finds the octet binary (OCTET, else beside the scripts as in the directory
# scripts/gpu_bundle.sh makes, else a checkout's build/ or build-gpu/) and the configs/bench directory (beside
# the scripts, else the checkout's). Needs $here, the sourcing script's directory; sets $octet and $config_dir
# (empty when there is none), or exits 2 when no octet binary is found.
octet="${OCTET:-}"
if [[ -z "$octet" ]]; then
  for candidate in "$here/octet" "$here/../build/tools/octet/octet" "$here/../build-gpu/tools/octet/octet"; do
    if [[ -x "$candidate" ]]; then octet="$candidate"; break; fi
  done
fi
if [[ -z "$octet" || ! -x "$octet" ]]; then
  echo "$(basename "$0"): no octet binary found: set OCTET=path/to/octet" >&2
  exit 2
fi
config_dir=""
for dir in "$here/configs/bench" "$here/../configs/bench"; do
  if [[ -d "$dir" ]]; then config_dir="$dir"; break; fi
done
