#!/bin/sh
# fio with the shapes of iobench.rs, on the same file (created by `cargo bench -p ufs-io --bench iobench`).
# Install: apt-get install -y fio. Usage: crates/ufs-io/benches/fio.sh [FILE] [SECONDS]
# psync at depth 1 is what ufs-io does with `async_io: false` (one thread, one pread at a time); libaio at
# depth 32 is what it does by default (one thread handing up to queue_depth reads to the kernel with AIO).
set -eu
FILE=${1:-${CARGO_TARGET_DIR:-target}/tmp/ufs-io-bench-256m.bin}
T=${2:-5}
common="--filename=$FILE --direct=1 --size=256M --runtime=$T --time_based --group_reporting --output-format=terse --terse-version=3"
# Terse v3: field 7 = read bandwidth (KiB/s), field 8 = read IOPS.
run() { printf '%-28s' "$1"; shift; fio --name=x $common "$@" | awk -F';' '{printf "%8d IOPS %9.1f MiB/s\n", $8, $7/1024}'; }
run "4k randread psync qd1"   --rw=randread --bs=4k   --ioengine=psync  --iodepth=1
run "4k randread libaio qd32" --rw=randread --bs=4k   --ioengine=libaio --iodepth=32
run "512k read psync qd1"     --rw=read     --bs=512k --ioengine=psync  --iodepth=1
