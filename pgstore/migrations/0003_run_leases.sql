-- A run's lease: the worker driving it (lease_owner, an opaque id, see
-- Options.Owner) and until when (lease_expires, the server's clock). Both
-- NULL: nobody drives the run. A lease is taken with a conditional UPDATE
-- (free or expired), renewed by its holder's appends and by its renewals,
-- and every append of a holder requires the owner to still be its own, so
-- a worker whose lease another took appends nothing more. The columns are
-- coordination, not the run's data: they are outside the row's checksum
-- (a damaged lease at worst keeps a run refused until it expires; the
-- tail rule still guards the stream).
ALTER TABLE {{schema}}.runs
	ADD COLUMN lease_owner   text,
	ADD COLUMN lease_expires timestamptz,
	ADD CONSTRAINT runs_lease_whole CHECK ((lease_owner IS NULL) = (lease_expires IS NULL));
