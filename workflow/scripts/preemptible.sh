#!/usr/bin/env bash
# preemptible.sh LEAD LOG COMMAND...: run a training command of the workflow (commrl train / verl-train / sweep
# worker) so that the announced end of its Slurm job costs no Snakemake retry (README, "Preemption and
# time limits").
#
# LEAD is the job's warning lead in seconds (--signal=USR1@LEAD in the profile's slurm_extra; 0: none),
# printed for the log. This shell outlives the warning: SIGUSR1 is ignored (as in the Snakefile; commrl
# installs its own handler) and a trapped SIGTERM or SIGHUP waits for the command (bash runs traps after it),
# so the command's status is always seen. The rules `exec` this script, so it replaces the shell Snakemake
# waits on: that shell, untrapped, would die of a SIGTERM sent to every process of the job (preemption,
# scancel) and Snakemake would fail the job while the command checkpoints for nobody
# (tests/workflow/test_preemptible.py). When the command exits 75 (commrl: preempted, its checkpoint written)
# inside a Slurm job, the job is requeued (`scontrol requeue`: the same job id, pending again, its full time
# limit on the next start; Snakemake keeps waiting for it); when that is refused (the job is not
# requeueable, MaxBatchRequeue is reached) status 75 goes to Snakemake, whose retry (profile `retries`)
# resubmits the job. Either way the next attempt resumes from the checkpoint.
#
# LOG is the rule's log, where the command's output goes. Snakemake deletes a job's log before it runs the
# job again (a requeued Slurm job, a retry), so an attempt that ends with a non-zero status leaves a copy
# beside it, LOG without .log plus .attempt-<UTC time>.log, which Snakemake does not know and keeps.
set -u
lead=$1
log=$2
shift 2
trap '' USR1
trap : TERM HUP
started=$(date -u +%Y%m%dT%H%M%SZ)
echo "preemptible: start ${started} on $(hostname); warning lead ${lead} s; Slurm job ${SLURM_JOB_ID:-none}" >&2
"$@"
rc=$?
keep() {  # this attempt's output, kept beside the log that the next attempt's start deletes
  cp "$log" "${log%.log}.attempt-${started}.log" 2>/dev/null || true
}
if [[ $rc -eq 75 && -n ${SLURM_JOB_ID:-} ]]; then
  # kept before the requeue: its SIGTERM reaches every process of the job, a cp running then too
  echo "preemptible: exit 75 (preempted, checkpoint written): Slurm job $SLURM_JOB_ID to be requeued" >&2
  keep
  if scontrol requeue "$SLURM_JOB_ID"; then
    # The requeue ends this run of the job (SIGTERM to every process, then SIGKILL). Wait for it here: a
    # job step that exited first could end the job FAILED before slurmctld requeues it, and a status check
    # at that moment makes Snakemake retry the job while its requeued copy runs too.
    sleep 120 &
    if wait $!; then  # not interrupted by the requeue's SIGTERM
      echo "preemptible: the requeue did not end the job in 120 s; Snakemake's retry resubmits" >&2
    fi
  else
    echo "preemptible: the requeue was refused; Snakemake's retry resubmits" >&2
    keep
  fi
elif [[ $rc -ne 0 ]]; then
  echo "preemptible: exit $rc" >&2
  keep
fi
exit "$rc"
