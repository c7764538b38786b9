#!/bin/sh
# Refresh the vendored MathJax 3 files from the npm registry (needs npm; the book build does not).
#   sh book/_static/mathjax/refresh.sh [VERSION]      (default: the version in package.json here)
# MathJax is Apache-2.0 (https://github.com/mathjax/MathJax); LICENSE here is the package's own.
# Kept: the combined component Sphinx loads (tex-mml-chtml.js: TeX and MathML input, CommonHTML
# output, the context menu), the CommonHTML fonts it fetches, and the TeX extensions its autoload
# fetches when a page uses them (\color, \cancel, \boldsymbol, ...). Left out (about 20 MB): the
# other combined components, the SVG output and the speech/explorer accessibility tools (SRE),
# which MathJax loads only when a reader switches them on in the menu.
set -e
here=$(cd "$(dirname "$0")" && pwd)
version=${1:-$(sed -n 's/.*"version": "\(.*\)".*/\1/p' "$here/package.json" | head -1)}
tmp=$(mktemp -d)
(cd "$tmp" && npm pack "mathjax@$version" >/dev/null && tar xzf "mathjax-$version.tgz")
rm -rf "$here/output" "$here/input"
mkdir -p "$here/output/chtml/fonts" "$here/input/tex"
cp "$tmp/package/es5/tex-mml-chtml.js" "$here/"
cp -r "$tmp/package/es5/output/chtml/fonts/woff-v2" "$here/output/chtml/fonts/"
cp -r "$tmp/package/es5/input/tex/extensions" "$here/input/tex/"
cp "$tmp/package/LICENSE" "$tmp/package/package.json" "$here/"
rm -rf "$tmp"
echo "vendored mathjax $version into $here"
