#!/bin/bash
# rank_time.sh OUTPREFIX cmd...: /usr/bin/time -v of this rank's process into OUTPREFIX.RANK
out=$1; shift
exec /usr/bin/time -v -o "$out.${OMPI_COMM_WORLD_RANK:-0}" "$@"
