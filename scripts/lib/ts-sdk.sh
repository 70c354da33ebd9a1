# Installs the official TypeScript SDK (@modelcontextprotocol/sdk, v1) and its v2 client
# (@modelcontextprotocol/client) into $TETHER_CACHE (default ~/.cache/tether) once; sets TS and
# TS_CLIENT (the directories they are installed in), TS_SDK_VERSION and TS_CLIENT_VERSION.
# Source it; it is not a command.
source "$(dirname "${BASH_SOURCE[0]}")/install.sh"
TS_SDK_VERSION=1.32.2
TS="$CACHE/ts-sdk-$TS_SDK_VERSION"
npm_install "$TS" "@modelcontextprotocol/sdk@$TS_SDK_VERSION"
TS_CLIENT_VERSION=2.4.0
TS_CLIENT="$CACHE/ts-client-$TS_CLIENT_VERSION"
npm_install "$TS_CLIENT" "@modelcontextprotocol/client@$TS_CLIENT_VERSION"
