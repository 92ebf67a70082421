#!/bin/busybox sh
# nsfast VM test guest /init (busybox sh). Written into every initramfs by `vmtest`.
#
# Protocol on the serial console (the host parses these lines; see crates/vmtest/src/report.rs):
#   NSFAST-INIT release=R nproc=N        /init started
#   NSFAST-MODULE name ok|FAIL           a module from /etc/nsfast/modules was loaded (or not)
#   NSFAST-TEST-START name               a test starts
#   NSFAST-TEST name PASS|FAIL rc=N      a test ended
#   NSFAST-DMESG-BEGIN / -END            the guest's full dmesg between these lines
#   NSFAST-DONE                          all tests ran; the guest powers off next
#   NSFAST-PEER-START / -END rc=N        a peer guest's command (only in the helper's log)
/bin/busybox mkdir -p /proc /sys /dev /tmp /run /sbin /usr/bin /usr/sbin /var/tmp
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin:/tests
export HOME=/root TERM=dumb NSFAST_VM_GUEST=1 RUST_BACKTRACE=1
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /dev/pts /dev/shm && mount -t devpts devpts /dev/pts && mount -t tmpfs shm /dev/shm
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
mkdir -p /sys/fs/bpf /sys/fs/cgroup /root
mount -t bpf bpf /sys/fs/bpf
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
ip link set lo up
hostname nsfast-guest
# Kernel messages below KERN_NOTICE stay out of the test output; dmesg keeps everything.
echo 5 > /proc/sys/kernel/printk

echo "NSFAST-INIT release=$(uname -r) nproc=$(nproc)"

# Kernel features the tests expect, from this kernel's own config, never from nsfast's probes
# (a test branching on the probe under test would follow a wrong probe to its easy branch):
# NSFAST_EXPECT_NETKIT, NSFAST_EXPECT_TCX, NSFAST_EXPECT_VSOCK_LOOPBACK = 1 or 0
# (crates/lab/src/kernel.rs reads them).
export NSFAST_KERNEL_CONFIG=/boot/config
expect_from_config() {
    if grep -Eq "^$2=(y|m)\$" /boot/config; then export "$1=1"; else export "$1=0"; fi
}
expect_from_config NSFAST_EXPECT_NETKIT CONFIG_NETKIT
expect_from_config NSFAST_EXPECT_TCX CONFIG_NET_XGRESS
expect_from_config NSFAST_EXPECT_VSOCK_LOOPBACK CONFIG_VSOCKETS_LOOPBACK
echo "NSFAST-EXPECT netkit=$NSFAST_EXPECT_NETKIT tcx=$NSFAST_EXPECT_TCX vsock_loopback=$NSFAST_EXPECT_VSOCK_LOOPBACK"

if [ -f /etc/nsfast/modules ]; then
    while read -r m; do
        [ -n "$m" ] || continue
        if out=$(modprobe "$m" 2>&1); then
            echo "NSFAST-MODULE $m ok"
        else
            echo "NSFAST-MODULE $m FAIL $out"
        fi
    done < /etc/nsfast/modules
fi

# A peer guest (`@peer` in guest-tests.txt, booted by a host helper with `{peer-qemu}`, which
# puts nsfast.role=peer on the kernel command line) runs /etc/nsfast/peer instead of the tests,
# until it exits or the helper is killed after the main guest.
case " $(cat /proc/cmdline) " in
*" nsfast.role=peer "*)
    echo "NSFAST-PEER-START"
    if [ -f /etc/nsfast/peer ]; then
        sh -c "$(cat /etc/nsfast/peer)" < /dev/null 2>&1
        echo "NSFAST-PEER-END rc=$?"
    else
        echo "NSFAST-PEER-END no /etc/nsfast/peer in this initramfs (no @peer line?)"
    fi
    sync
    poweroff -f
    ;;
esac

# A guest booted again after an emulator fault (the harness puts nsfast.from=NAME on the
# kernel command line) runs the tests from NAME on.
from=""
for w in $(cat /proc/cmdline); do
    case "$w" in
    nsfast.from=*) from=${w#nsfast.from=} ;;
    esac
done

# /etc/nsfast/tests: NAME<TAB>TIMEOUT<TAB>COMMAND, one per line.
tab=$(printf '\t')
while IFS="$tab" read -r name secs cmd; do
    [ -n "$name" ] || continue
    if [ -n "$from" ]; then
        [ "$name" = "$from" ] || continue
        from=""
    fi
    echo "NSFAST-TEST-START $name"
    cd /
    timeout -s KILL "$secs" sh -c "$cmd" < /dev/null 2>&1
    rc=$?
    if [ "$rc" = 0 ]; then
        echo "NSFAST-TEST $name PASS rc=0"
    elif [ "$rc" = 137 ]; then
        echo "NSFAST-TEST $name FAIL rc=$rc (killed: timeout ${secs}s?)"
    else
        echo "NSFAST-TEST $name FAIL rc=$rc"
    fi
done < /etc/nsfast/tests

echo "NSFAST-DMESG-BEGIN"
dmesg
echo "NSFAST-DMESG-END"
echo "NSFAST-DONE"
sync
poweroff -f
