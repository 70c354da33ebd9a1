# Installs pinned packages into the cache once each (source it; it is not a command):
#   npm_install DIR PACKAGE@VERSION   an npm package into DIR/node_modules
#   pip_install DIR PACKAGE==VERSION  a PyPI package into a venv at DIR
# A directory holding `.installed` is complete; a failed install prints its log and exits.
CACHE="${TETHER_CACHE:-$HOME/.cache/tether}"

npm_install() {
  [ -f "$1/.installed" ] && return
  mkdir -p "$1"
  local log; log="$(mktemp)"
  (cd "$1" && { [ -f package.json ] || npm init -y >/dev/null; } \
    && npm install --no-audit --no-fund "$2" >"$log" 2>&1) || { cat "$log" >&2; rm -f "$log"; exit 1; }
  rm -f "$log"
  touch "$1/.installed"
}

pip_install() {
  [ -f "$1/.installed" ] && return
  mkdir -p "$(dirname "$1")"
  python3 -m venv "$1"
  local log; log="$(mktemp)"
  "$1/bin/pip" install --quiet "$2" >"$log" 2>&1 || { cat "$log" >&2; rm -f "$log"; exit 1; }
  rm -f "$log"
  touch "$1/.installed"
}
