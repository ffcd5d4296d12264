-- Run once by the postgres image on an empty data volume (/docker-entrypoint-initdb.d).
-- Databases are owned by POSTGRES_USER.
CREATE DATABASE dagster;
CREATE DATABASE corpus_catalog;
