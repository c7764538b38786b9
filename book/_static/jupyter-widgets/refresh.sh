#!/bin/sh
# Refresh the vendored ipywidgets embedding scripts from the npm registry (needs npm; the book
# build does not). Pages whose notebooks store widget state load these two files (_config.yml,
# nb_ipywidgets_js) instead of myst-nb's default CDN copies:
#   require.js     RequireJS 2.3.4 (MIT: the licence is in the file's header), the AMD loader
#   embed-amd.js   @jupyter-widgets/html-manager 1.0.6 (BSD-3-Clause, LICENSE here): renders the
#                  stored state of the standard ipywidgets (sliders, dropdowns, Output, ...)
# The same versions as myst-nb 1.4.0's defaults. A widget from another package would still be
# fetched from a CDN; the course's notebooks use only ipywidgets' own.
#   sh book/_static/jupyter-widgets/refresh.sh
set -e
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
(cd "$tmp" && npm pack requirejs@2.3.4 @jupyter-widgets/html-manager@1.0.6 >/dev/null \
  && mkdir r h && tar xzf requirejs-2.3.4.tgz -C r && tar xzf jupyter-widgets-html-manager-1.0.6.tgz -C h)
cp "$tmp/r/package/require.js" "$here/require.js"
cp "$tmp/h/package/dist/embed-amd.js" "$here/embed-amd.js"
cp "$tmp/h/package/LICENSE" "$here/LICENSE"
rm -rf "$tmp"
echo "vendored require.js 2.3.4 and html-manager 1.0.6 embed-amd.js into $here"
