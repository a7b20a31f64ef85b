#!/bin/bash
# Fences a TensorFlow-backend job's ports (--backend=tensorflow) to the job's own nodes and
# user: TensorFlow's gRPC server runs graphs, reading and writing files as the job's user, for
# anyone who connects (docs/deploying.md, "Who can reach the TensorFlow backend's ports").
# One script, installed by the admin (e.g. /etc/slurm/crossover_tf_ports.sh), in three roles
# that Slurm tells apart by SLURM_SCRIPT_CONTEXT:
#
#   slurm.conf:  Prolog=/etc/slurm/crossover_tf_ports.sh
#                Epilog=/etc/slurm/crossover_tf_ports.sh
#                TaskProlog=/etc/slurm/crossover_tf_ports.sh
#
# prolog_slurmd (root, on every node of the allocation, before the job): an nftables table
#   crossover_tf_job_<id> that, for the job's port block,
#   - drops new connections from any host outside the allocation (input: source not one of the
#     job's nodes' addresses nor loopback; replies to this node's own connections pass), and
#   - refuses what any other user's process on this node opens to it, locally or on another of
#     the job's nodes (output: destination loopback or one of the job's nodes, socket owner not
#     the job's uid; that node's own table drops the rest): only the job's user on the job's
#     nodes reaches the job's servers, and the same port numbers elsewhere stay free to all.
# epilog_slurmd (root, after the job): removes that table.
# prolog_task (the job's user, before each task): prints `export CROSSOVER_TF_PORT_BASE=...`,
#   so that every step's ranks take their ports inside the fenced block (crossover_tf reads it:
#   crossover_tf/_communication/tensorflow.py, slurm_port_base); step s gets 16 ports at
#   block + 16 * (s % 4): up to 16 ranks a node, and the two steps of a crossover pair apart.
#
# The block is 64 ports, 10000 + 64 * (job id % 355), all below Linux's ephemeral range
# (ip_local_port_range starts at 32768), so no node's outgoing connections take its ports:
# two jobs on one node meet only when their ids are 355 apart. Needs nft (Debian's nftables) and getent on every node.
# CROSSOVER_TF_PORTS_DRY_RUN=1 prints the rules instead of loading them.
set -euo pipefail

BLOCK_PORTS=64
STEP_PORTS=16

block_start() { echo $((10000 + BLOCK_PORTS * ($1 % 355))); }

# The IPv4 or IPv6 ($1: ahostsv4 or ahostsv6) addresses of the allocation's nodes, comma-
# separated (empty: none).
node_addresses() {
    local hosts
    hosts=$(scontrol show hostnames "$SLURM_JOB_NODELIST" 2>/dev/null || echo "$SLURM_JOB_NODELIST")
    # shellcheck disable=SC2086
    getent "$1" $hosts | awk '{print $1}' | sort -u | paste -sd, -
}

# One family's input rule: a new connection from a source outside the set (and not
# loopback), dropped.
input_rule() {
    local family=$1 loopback=$2 addresses=$3 ports=$4
    echo "tcp dport $ports ct state new $family saddr != { $loopback${addresses:+, $addresses} } drop"
}

# One family's output rule: another user's connection to the job's nodes (or loopback),
# refused.
output_rule() {
    local family=$1 loopback=$2 addresses=$3 ports=$4 uid=$5
    echo "tcp dport $ports $family daddr { $loopback${addresses:+, $addresses} } meta skuid != $uid reject with tcp reset"
}

rules() {
    local ports job=$SLURM_JOB_ID uid=$SLURM_JOB_UID start
    start=$(block_start "$job")
    ports="$start-$((start + BLOCK_PORTS - 1))"
    cat <<EOF
table inet crossover_tf_job_$job {
    chain input {
        type filter hook input priority filter - 1; policy accept;
        $(input_rule ip 127.0.0.0/8 "$(node_addresses ahostsv4)" "$ports")
        $(input_rule ip6 ::1 "$(node_addresses ahostsv6)" "$ports")
    }
    chain output {
        type filter hook output priority filter - 1; policy accept;
        $(output_rule ip 127.0.0.0/8 "$(node_addresses ahostsv4)" "$ports" "$uid")
        $(output_rule ip6 ::1 "$(node_addresses ahostsv6)" "$ports" "$uid")
    }
}
EOF
}

load() {
    if [ "${CROSSOVER_TF_PORTS_DRY_RUN:-0}" = 1 ]; then rules; else rules | nft -f -; fi
}

case "${SLURM_SCRIPT_CONTEXT:-}" in
    prolog_slurmd) load ;;
    epilog_slurmd) nft delete table inet "crossover_tf_job_$SLURM_JOB_ID" 2>/dev/null || true ;;
    prolog_task)
        echo "export CROSSOVER_TF_PORT_BASE=$(( $(block_start "$SLURM_JOB_ID") \
            + STEP_PORTS * (${SLURM_STEP_ID:-0} % (BLOCK_PORTS / STEP_PORTS)) ))" ;;
    *) echo "crossover_tf_ports.sh: run by Slurm as Prolog, Epilog or TaskProlog" \
            "(SLURM_SCRIPT_CONTEXT is '${SLURM_SCRIPT_CONTEXT:-}')" >&2; exit 2 ;;
esac
