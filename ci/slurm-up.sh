#!/usr/bin/env bash
# A single-node SLURM cluster on this host (munged, slurmctld, slurmd), for the
# SLURM executor's tests and for trying `crucible-dispatch --executor slurm` on
# a laptop (docs/run-on-a-cluster.md, "SLURM"). Idempotent: installs slurm-wlm
# and munge if missing, writes /etc/slurm/slurm.conf for this host unless one
# not written by this script is there, starts what is not running, and waits
# until `sinfo` shows the node idle. Needs root (or sudo) and apt-get.
# Exit 0: the cluster answers; non-zero: it could not start (the SLURM tests
# then skip, saying so). With CRUCIBLE_SLURM_NO_INSTALL=1 (the tests' own call)
# nothing is installed: missing packages are exit 1.
set -euo pipefail

if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo -n"; fi
conf=/etc/slurm/slurm.conf
marker="# written by crucible ci/slurm-up.sh"

say() { echo "slurm-up: $*" >&2; }

if ! command -v slurmctld >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
    if [ "${CRUCIBLE_SLURM_NO_INSTALL:-0}" = 1 ]; then say "slurm-wlm and munge are not installed"; exit 1; fi
    command -v apt-get >/dev/null 2>&1 || { say "no slurmctld/munged and no apt-get"; exit 1; }
    say "installing slurm-wlm and munge"
    $sudo apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq slurm-wlm munge >/dev/null
fi

host=$(hostname -s)
cpus=$(nproc)
# what slurmd may hand out: physical memory less 512 MiB for the system
mem_mib=$(( $(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024 - 512 ))
# a job that asks no memory gets this much per CPU, not the whole node
def_mem=$(( mem_mib / cpus / 2 ))

if [ ! -f "$conf" ] || grep -qF "$marker" "$conf"; then
    tmp=$(mktemp)
    cat > "$tmp" <<CONF
$marker
ClusterName=crucible
SlurmctldHost=$host
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# --mem enforced without cgroups: the step is killed past its limit
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=1
JobAcctGatherParams=OverMemoryKill
AccountingStorageType=accounting_storage/none
DefMemPerCPU=$def_mem
# ended jobs stay visible to scontrol show job for 5 minutes (no sacct here)
MinJobAge=300
KillWait=10
ReturnToService=2
SchedulerType=sched/backfill
# a small test cluster: look for work every second, not every minute
SchedulerParameters=sched_interval=1,batch_sched_delay=0,sched_min_interval=0
SlurmctldPort=6817
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
NodeName=$host CPUs=$cpus RealMemory=$mem_mib State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
    if ! cmp -s "$tmp" "$conf" 2>/dev/null; then
        $sudo install -D -m 644 "$tmp" "$conf"
        changed=1
    fi
    rm -f "$tmp"
fi
$sudo mkdir -p /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge
$sudo chown munge:munge /run/munge 2>/dev/null || true

if [ ! -s /etc/munge/munge.key ]; then
    $sudo dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    $sudo chown munge:munge /etc/munge/munge.key
    $sudo chmod 400 /etc/munge/munge.key
fi
if ! munge -n </dev/null >/dev/null 2>&1; then
    say "starting munged"
    $sudo -u munge munged 2>/dev/null || $sudo runuser -u munge -- munged || $sudo munged --force
fi

running() { pgrep -x "$1" >/dev/null 2>&1; }
if [ "${changed:-0}" = 1 ]; then  # a new slurm.conf: the daemons read it at start
    for d in slurmd slurmctld; do
        if running "$d"; then $sudo pkill -x "$d" || true; fi
    done
    for _ in $(seq 1 40); do  # gone before they start again
        running slurmd || running slurmctld || break
        sleep 0.25
    done
fi
running slurmctld || { say "starting slurmctld"; $sudo slurmctld; }
running slurmd || { say "starting slurmd"; $sudo slurmd; }

# the node idle (or mixed/allocated: running jobs), within 60 s
for _ in $(seq 1 120); do
    state=$(sinfo -h -N -n "$host" -o %T 2>/dev/null || true)
    case "$state" in
        idle*|mixed*|allocated*|completing*) say "node $host is $state"; exit 0 ;;
        down*|drain*|fail*) $sudo scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true ;;
    esac
    sleep 0.5
done
say "the node did not come up (sinfo: ${state:-no answer}); see /var/log/slurm/"
exit 1
