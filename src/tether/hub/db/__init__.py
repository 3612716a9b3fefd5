"""The hub's database: typed SQLAlchemy 2 ORM models, the async engine and Alembic migrations."""
