-- One dedupe key, the content hash, as on SQLite (`migrations/sqlite/0011_one_dedupe_key.sql`):
-- the same body is the same delivery, whatever id it came under; the delivery id stays, for
-- logs and the operator. (`seq` is an identity here and never used twice.)
ALTER TABLE deliveries DROP CONSTRAINT IF EXISTS deliveries_delivery_id_key;
