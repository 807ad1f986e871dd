-- Event values are compressed by the store already when they are worth
-- compressing (S2, see events), so PostgreSQL's own compression of large
-- values (pglz) only spends CPU: EXTERNAL storage skips it. And a row of up
-- to a page stays in the table itself (toast_tuple_target), instead of
-- moving its value to the TOAST table — an insert into that table and its
-- index per event of more than 2 KB.
ALTER TABLE {{schema}}.events ALTER COLUMN value SET STORAGE EXTERNAL;
ALTER TABLE {{schema}}.events SET (toast_tuple_target = 8160);
