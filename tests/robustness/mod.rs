//! Bad input and careless use across modules: the data-loss regressions of issues 19 and 30, sizes and corrupt decoder input, seeded mutations of every file kind.

mod bad_sizes;
mod mutation;
mod reliability;
