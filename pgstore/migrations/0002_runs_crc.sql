-- Each runs row carries a CRC-32C over its columns (seams.RunInfo.Checksum
-- of the row, run_id included, without a key), written with the row in
-- the transaction of every append; a row that no longer sums to it is
-- damage. Rows written before this migration get theirs from Migrate
-- (computed in Go over their values as they stand), which then makes the
-- column NOT NULL.
ALTER TABLE {{schema}}.runs ADD COLUMN crc bigint CHECK (crc BETWEEN 0 AND 4294967295);
