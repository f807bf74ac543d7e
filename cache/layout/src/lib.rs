//! The layout layer of stagefs: how the files of a source are arranged into models. [`hf`] reads
//! the Hugging Face hub cache layout (`models--org--name` with `refs/`, `snapshots/`
//! and `blobs/`); [`models`] finds models of every form wherever they sit in a
//! source, and the files each one is made of. Both only read the source.

pub mod hf;
pub mod models;
