//! `tensor-types`: the vocabulary the Sparrow crates share, and nothing else.
//!
//! * [`WeightFormat`]: how a weight matrix or tensor is stored, one table of the ggml formats (type id,
//!   name, block length, block bytes, as in llama.cpp's `ggml.c` `type_traits`) plus
//!   [`WeightFormat::I4Hybrid`], Sparrow's per-channel INT4 + INT8 outlier format (no ggml id; row
//!   layout in [`hybrid`]). Model files (`model-format`), the kernels (`kernels-neon`), the neuron store
//!   and the engine all use this one enum.
//! * [`QMatrix`]: a borrowed `rows × cols` matrix in one of those formats, its length checked.
//! * [`Activation`]: the FFN activation (SiLU, ReLU).
//! * [`Precision`]: the accuracy/speed trade-off of the quantized kernels.
//!
//! # Example
//!
//! ```
//! use tensor_types::{QMatrix, WeightFormat};
//!
//! let f = WeightFormat::from_ggml_id(8).unwrap();
//! assert_eq!((f, f.name(), f.block_len(), f.block_bytes()), (WeightFormat::Q8_0, "Q8_0", 32, 34));
//! assert_eq!(f.row_bytes(64), Some(68));
//! assert_eq!(WeightFormat::I4Hybrid { outliers_per_row: 6 }.ggml_id(), None);
//!
//! let data = vec![0u8; 2 * 68];
//! let m = QMatrix::new(f, 2, 64, &data).unwrap();
//! assert_eq!(m.row_data(1).len(), 68);
//! ```
//!
//! # Invariants
//!
//! * One definition of every format: adding a ggml format is one row of the table in `format.rs`
//!   (the kernels and readers then match on the new variant where they support it).
//! * [`WeightFormat::from_ggml_id`] and [`WeightFormat::ggml_id`] are inverse on [`WeightFormat::GGML`];
//!   sizes are llama.cpp's (unit tests).
//! * A [`QMatrix`] always holds exactly `rows * format.row_bytes(cols)` bytes, and a hybrid one only
//!   outlier columns `< cols`; shape and length errors are [`LayoutError`]s, never panics.
//! * No workspace dependencies: every crate may use this one (layer 0 in `xtask/tests/it/layering.rs`).

mod activation;
mod error;
mod format;
pub mod hybrid;
mod matrix;
mod precision;

pub use activation::Activation;
pub use error::LayoutError;
pub use format::{WeightFormat, IQ4NL_VALUES};
pub use matrix::QMatrix;
pub use precision::Precision;
