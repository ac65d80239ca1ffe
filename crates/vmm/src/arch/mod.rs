//! Architecture-specific setup. Only x86_64 exists here.

pub mod x86_64;
