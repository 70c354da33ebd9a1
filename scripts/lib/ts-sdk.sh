# Installs the official TypeScript SDK (@modelcontextprotocol/sdk) into $TETHER_CACHE (default
# ~/.cache/tether) once; sets TS (the directory it is installed in) and TS_SDK_VERSION. Source
# it; it is not a command.
source "$(dirname "${BASH_SOURCE[0]}")/install.sh"
TS_SDK_VERSION=1.32.2
TS="$CACHE/ts-sdk-$TS_SDK_VERSION"
npm_install "$TS" "@modelcontextprotocol/sdk@$TS_SDK_VERSION"
