#!/bin/sh
# Refresh the vendored Pyodide core files from the npm registry (needs npm; the book build does not).
#   sh book/_static/pyodide/refresh.sh [VERSION]      (default: the version in package.json here)
# pyodide.mjs is the ES-module loader: the book runs Pyodide in a module Web Worker
# (_static/explorers/calc-worker.js), where the classic pyodide.js refuses to run.
# Pyodide is MPL-2.0 (https://github.com/pyodide/pyodide); LICENSE here is the MPL-2.0 text.
set -e
here=$(cd "$(dirname "$0")" && pwd)
version=${1:-$(sed -n 's/.*"version": "\(.*\)".*/\1/p' "$here/package.json" | head -1)}
tmp=$(mktemp -d)
(cd "$tmp" && npm pack "pyodide@$version" >/dev/null && tar xzf "pyodide-$version.tgz")
for f in pyodide.mjs pyodide.asm.mjs pyodide.asm.wasm python_stdlib.zip pyodide-lock.json package.json; do
  cp "$tmp/package/$f" "$here/$f"
done
rm -rf "$tmp"
echo "vendored pyodide $version into $here"
