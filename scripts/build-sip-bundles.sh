#!/usr/bin/env bash
# Rebuilds the two SIP client bundles that are checked in (needs npm and the npm registry; `make test` and CI do
# not run it): JsSIP for the SIP web phone and SIP.js for the browser tests, each one minified IIFE by esbuild,
# at the versions pinned in scripts/sip-bundles/package.json and package-lock.json. Writes each bundle with its
# licence and its sha256 into the README beside it; tests/unit/test_sip_bundles.py checks they still agree.
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
root=$PWD
work=scripts/sip-bundles
(cd "$work" && npm ci --no-audit --no-fund --loglevel=error)

version() { node -p "require('$root/$work/node_modules/$1/package.json').version"; }
esbuild_version=$(version esbuild)

bundle() {  # bundle NPM_NAME ENTRY OUT_DIR OUT_NAME
  local name=$1 entry=$2 dir=$3 out=$4 v
  v=$(version "$name")
  mkdir -p "$dir"
  "$work/node_modules/.bin/esbuild" "$work/$entry" --bundle --minify --format=iife --platform=browser \
    --target=es2019 --legal-comments=eof --log-level=warning \
    --banner:js="/*! $name $v (MIT licence, see LICENSE.$name.md) bundled by scripts/build-sip-bundles.sh with esbuild $esbuild_version */" \
    --outfile="$dir/$out"
  cp "$work/node_modules/$name/LICENSE.md" "$dir/LICENSE.$name.md"
  echo "$name $v $(sha256sum "$dir/$out" | cut -d' ' -f1) $out"
}

jssip=$(bundle jssip jssip-entry.js voicepipe/web/sipphone/vendor jssip.min.js)
sipjs=$(bundle sip.js sipjs-entry.js tests/browser/sipjs sip.min.js)

readme() {  # readme DIR "name version sha256 file" PURPOSE
  local dir=$1 purpose=$3
  read -r name v sha file <<<"$2"
  cat > "$dir/README.md" <<MD
# $file

$purpose

- package: \`$name\` $v from npm (MIT licence: \`LICENSE.$name.md\`; its npm dependencies, bundled with it, are MIT-licensed too)
- built by \`scripts/build-sip-bundles.sh\` with esbuild $esbuild_version (minified IIFE, ES2019)
- sha256: \`$sha\`

Do not edit the bundle by hand: change the pin in \`scripts/sip-bundles/package.json\` and rerun the script.
MD
  echo "wrote $dir/$file ($name $v)"
}
readme voicepipe/web/sipphone/vendor "$jssip" "JsSIP for the SIP web phone (/sipphone), as the global \`JsSIP\`."
readme tests/browser/sipjs "$sipjs" "SIP.js for the browser tests of /sip (tests/e2e/test_call_sip.py), as the global \`SIP\`."
