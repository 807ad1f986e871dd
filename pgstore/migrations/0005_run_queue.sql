-- The worker pool's queue (seams.RunQueue, seams.RunCanceller), kept on
-- the runs rows as the leases are: coordination, not the run's data, so
-- outside the row's checksum.
--
-- agent: RunStarted.Agent, written by the start append (NULL: a run no
-- worker claims). failures, last_error and retry_at: the times a worker
-- gave the run back because driving it failed, the last such failure, and
-- when a worker may claim it again (NULL: at once). cancel_by, cancel_at:
-- an operator's request to cancel the run (both NULL: none; the first
-- request stays).
ALTER TABLE {{schema}}.runs
	ADD COLUMN agent      text,
	ADD COLUMN failures   integer NOT NULL DEFAULT 0 CHECK (failures >= 0),
	ADD COLUMN last_error text,
	ADD COLUMN retry_at   timestamptz,
	ADD COLUMN cancel_by  text,
	ADD COLUMN cancel_at  timestamptz,
	ADD CONSTRAINT runs_cancel_whole CHECK ((cancel_by IS NULL) = (cancel_at IS NULL));

-- What a claim reads: the unfinished runs with an agent, by agent, then by
-- their lease's expiry, free ones (NULL) first. A claim reads two ranges
-- of each of its agents — the free runs, and the runs whose lease has run
-- out — so it visits its agents' claimable runs only, never another
-- agent's queue, nor the runs a live worker holds, nor a finished run (a
-- finished run leaves this index in the transaction of the append that
-- finishes it), however many there are. (Runs waiting out a retry are
-- read and skipped.)
CREATE INDEX runs_claimable ON {{schema}}.runs (agent, lease_expires NULLS FIRST)
	WHERE status = 'running' AND agent IS NOT NULL;
