//! Pure, seeded generators.
