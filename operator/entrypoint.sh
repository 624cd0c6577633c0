#!/bin/sh
# The operator image's entrypoint: `kai-ray operator` with the image's
# arguments (the chart passes --config, the ports, leader election and the
# webhook's service). `kai-ray operator --help` lists them.
set -eu
exec /opt/kai-ray/bin/kai-ray operator "$@"
