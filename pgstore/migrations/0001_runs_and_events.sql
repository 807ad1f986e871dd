-- The run index: one row per run, updated in the transaction of every
-- append, so listings need not scan streams. events and last_id anchor the
-- stream (Load refuses a stream with another length or another last key).
CREATE TABLE {{schema}}.runs (
	run_id      text        PRIMARY KEY,
	status      text        NOT NULL CHECK (status IN ('running', 'finished')),
	steps       integer     NOT NULL CHECK (steps >= 0),
	events      bigint      NOT NULL CHECK (events >= 1),
	stop_reason text        NOT NULL,
	first_event timestamptz NOT NULL,
	last_event  timestamptz NOT NULL,
	last_id     bytea       NOT NULL CHECK (length(last_id) = 16)
);

-- The streams: seq numbers a run's events 1, 2, 3, ... in order; id is the
-- event's ULID key (increasing with seq); value is the envelope exactly as
-- the bbolt store writes it (CRC-32C trailer included), crc that checksum.
CREATE TABLE {{schema}}.events (
	run_id text    NOT NULL,
	seq    bigint  NOT NULL CHECK (seq >= 1),
	id     bytea   NOT NULL CHECK (length(id) = 16),
	kind   text    NOT NULL,
	value  bytea   NOT NULL,
	crc    bigint  NOT NULL,
	PRIMARY KEY (run_id, seq)
);
