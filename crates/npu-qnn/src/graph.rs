//! The graph builder: tensors (inputs, outputs, intermediates, static weights), nodes of the
//! built-in op package, finalize and execute.

use std::ffi::{c_void, CStr, CString};
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use npu_qnn_sys::*;

use crate::backend::{Context, ContextInner, Handle};
use crate::error::QnnError;
use crate::library::{check, func};

static GRAPH_SERIAL: AtomicU64 = AtomicU64::new(1);

/// A tensor of one [`Graph`] (inputs, outputs, intermediates and weights alike).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tensor {
    graph: u64,
    index: usize,
}

/// What the graph keeps of each tensor: the storage the `Qnn_Tensor_t` it passes points into.
struct TensorRec {
    name: CString,
    dims: Vec<u32>,
    kind: Qnn_TensorType_t,
    data_type: Qnn_DataType_t,
    /// QNN's id, written by `tensorCreateGraphTensor`.
    id: u32,
    /// Per-row scales (axis 0) of a quantized weight; empty for f32.
    scale_offsets: Vec<Qnn_ScaleOffset_t>,
    /// Static data, kept until finalize.
    data: Vec<u8>,
}

impl TensorRec {
    fn len(&self) -> usize {
        self.dims.iter().map(|&d| d as usize).product()
    }

    /// A version-1 `Qnn_Tensor_t` pointing into this record (valid while it is neither moved out
    /// of nor changed: the pointers are to the heap buffers of its `CString` and `Vec`s).
    fn raw(&mut self, data: *mut c_void, size: u32) -> Qnn_Tensor_t {
        let mut quantize = Qnn_QuantizeParams_t::INIT;
        if !self.scale_offsets.is_empty() {
            quantize.encodingDefinition = QNN_DEFINITION_DEFINED;
            quantize.quantizationEncoding = QNN_QUANTIZATION_ENCODING_AXIS_SCALE_OFFSET;
            quantize.encoding = Qnn_QuantizeParamsEncoding {
                axisScaleOffsetEncoding: Qnn_AxisScaleOffset_t {
                    axis: 0,
                    numScaleOffsets: self.scale_offsets.len() as u32,
                    scaleOffset: self.scale_offsets.as_mut_ptr(),
                },
            };
        }
        Qnn_Tensor_t::from_v1(Qnn_TensorV1_t {
            id: self.id,
            name: self.name.as_ptr(),
            type_: self.kind,
            dataFormat: QNN_TENSOR_DATA_FORMAT_FLAT_BUFFER,
            dataType: self.data_type,
            quantizeParams: quantize,
            rank: self.dims.len() as u32,
            dimensions: self.dims.as_mut_ptr(),
            memType: QNN_TENSORMEMTYPE_RAW,
            memory: Qnn_TensorMemory {
                clientBuf: Qnn_ClientBuffer_t {
                    data,
                    dataSize: size,
                },
            },
        })
    }
}

/// A QNN graph under construction, then finalized and executed. Nodes must be added in dependency
/// order (every intermediate written by an earlier node), as QNN requires.
pub struct Graph {
    ctx: Arc<ContextInner>,
    handle: Handle,
    serial: u64,
    tensors: Vec<TensorRec>,
    inputs: Vec<usize>,
    outputs: Vec<usize>,
    finalized: bool,
}

fn cname(s: &str) -> Result<CString, QnnError> {
    CString::new(s).map_err(|_| QnnError::Name(s.to_string()))
}

fn shape(what: &str, detail: String) -> QnnError {
    QnnError::Shape {
        what: what.to_string(),
        detail,
    }
}

impl Graph {
    /// Creates an empty graph named `name` (unique within the context) in `ctx`.
    pub fn new(ctx: &Context, name: &str) -> Result<Graph, QnnError> {
        let create = func("graphCreate", ctx.inner.table().graphCreate)?;
        let name = cname(name)?;
        let mut handle = ptr::null_mut();
        // SAFETY: the context handle is live (held by `ctx`); `name` is a C string for the call;
        // a null config array is allowed; `handle` is a live out-pointer.
        check("graphCreate", unsafe {
            create(ctx.inner.handle.0, name.as_ptr(), ptr::null(), &mut handle)
        })?;
        Ok(Graph {
            ctx: ctx.inner.clone(),
            handle: Handle(handle),
            serial: GRAPH_SERIAL.fetch_add(1, Ordering::Relaxed),
            tensors: Vec::new(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            finalized: false,
        })
    }

    fn rec(&self, t: Tensor) -> Result<&TensorRec, QnnError> {
        if t.graph != self.serial {
            return Err(QnnError::State("a tensor of another graph"));
        }
        Ok(&self.tensors[t.index])
    }

    fn dims(&self, t: Tensor) -> Result<&[u32], QnnError> {
        Ok(&self.rec(t)?.dims)
    }

    fn create(
        &mut self,
        name: &str,
        dims: &[usize],
        kind: Qnn_TensorType_t,
        data_type: Qnn_DataType_t,
        scale_offsets: Vec<Qnn_ScaleOffset_t>,
        data: Vec<u8>,
    ) -> Result<Tensor, QnnError> {
        if self.finalized {
            return Err(QnnError::State("tensor added to a finalized graph"));
        }
        let dims32: Vec<u32> = dims
            .iter()
            .map(|&d| u32::try_from(d).ok().filter(|&d| d > 0))
            .collect::<Option<_>>()
            .ok_or_else(|| shape(name, format!("dimensions {dims:?}: each in 1..2^32")))?;
        let size = u32::try_from(data.len())
            .map_err(|_| shape(name, "static data of 4 GiB or more".into()))?;
        let create = func(
            "tensorCreateGraphTensor",
            self.ctx.table().tensorCreateGraphTensor,
        )?;
        let mut rec = TensorRec {
            name: cname(name)?,
            dims: dims32,
            kind,
            data_type,
            id: 0,
            scale_offsets,
            data,
        };
        let data_ptr = if rec.data.is_empty() {
            ptr::null_mut()
        } else {
            rec.data.as_mut_ptr().cast()
        };
        let mut raw = rec.raw(data_ptr, size);
        // SAFETY: the graph handle is live (its context is held); `raw` points into `rec`, alive
        // and unchanged for the call; static data stays in `rec` until finalize.
        check("tensorCreateGraphTensor", unsafe {
            create(self.handle.0, &mut raw)
        })?;
        rec.id = raw.v1().map_or(0, |v| v.id);
        self.tensors.push(rec);
        Ok(Tensor {
            graph: self.serial,
            index: self.tensors.len() - 1,
        })
    }

    /// A graph input (APP_WRITE, f32), given to [`Graph::execute`] in the order inputs were made.
    pub fn input(&mut self, name: &str, dims: &[usize]) -> Result<Tensor, QnnError> {
        let t = self.create(
            name,
            dims,
            QNN_TENSOR_TYPE_APP_WRITE,
            QNN_DATATYPE_FLOAT_32,
            vec![],
            vec![],
        )?;
        self.inputs.push(t.index);
        Ok(t)
    }

    /// A graph output (APP_READ, f32), filled by [`Graph::execute`] in the order outputs were made.
    pub fn output(&mut self, name: &str, dims: &[usize]) -> Result<Tensor, QnnError> {
        let t = self.create(
            name,
            dims,
            QNN_TENSOR_TYPE_APP_READ,
            QNN_DATATYPE_FLOAT_32,
            vec![],
            vec![],
        )?;
        self.outputs.push(t.index);
        Ok(t)
    }

    /// An intermediate (NATIVE, f32): written by one node, read by later ones, never seen outside.
    pub fn native(&mut self, name: &str, dims: &[usize]) -> Result<Tensor, QnnError> {
        self.create(
            name,
            dims,
            QNN_TENSOR_TYPE_NATIVE,
            QNN_DATATYPE_FLOAT_32,
            vec![],
            vec![],
        )
    }

    /// A static f32 tensor (weights, bias), row-major.
    pub fn static_f32(
        &mut self,
        name: &str,
        dims: &[usize],
        values: &[f32],
    ) -> Result<Tensor, QnnError> {
        let n: usize = dims.iter().product();
        if values.len() != n {
            return Err(QnnError::Length {
                what: name.to_string(),
                expected: n,
                got: values.len(),
            });
        }
        let data = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
        self.create(
            name,
            dims,
            QNN_TENSOR_TYPE_STATIC,
            QNN_DATATYPE_FLOAT_32,
            vec![],
            data,
        )
    }

    /// A static INT8 weight matrix `[out, in]`, row-major, symmetric per output channel: row `r` is
    /// `values[r*in..] * scales[r]` (QNN: `SFIXED_POINT_8`, `AXIS_SCALE_OFFSET` on axis 0, offsets 0).
    pub fn static_i8_per_row(
        &mut self,
        name: &str,
        dims: [usize; 2],
        values: &[i8],
        scales: &[f32],
    ) -> Result<Tensor, QnnError> {
        let [rows, cols] = dims;
        if values.len() != rows * cols {
            return Err(QnnError::Length {
                what: name.to_string(),
                expected: rows * cols,
                got: values.len(),
            });
        }
        if scales.len() != rows {
            return Err(QnnError::Length {
                what: format!("{name} scales"),
                expected: rows,
                got: scales.len(),
            });
        }
        if let Some(s) = scales.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
            return Err(shape(
                name,
                format!("scale {s}: QNN needs finite scales > 0"),
            ));
        }
        let so = scales
            .iter()
            .map(|&scale| Qnn_ScaleOffset_t { scale, offset: 0 })
            .collect();
        let data = values.iter().map(|&v| v as u8).collect();
        self.create(
            name,
            &dims,
            QNN_TENSOR_TYPE_STATIC,
            QNN_DATATYPE_SFIXED_POINT_8,
            so,
            data,
        )
    }

    fn add_node(
        &mut self,
        name: &str,
        op: &CStr,
        ins: &[Tensor],
        out: Tensor,
    ) -> Result<(), QnnError> {
        if self.finalized {
            return Err(QnnError::State("node added to a finalized graph"));
        }
        if self.rec(out)?.kind == QNN_TENSOR_TYPE_STATIC
            || self.rec(out)?.kind == QNN_TENSOR_TYPE_APP_WRITE
        {
            return Err(shape(
                name,
                "output must be an intermediate or a graph output".into(),
            ));
        }
        for &t in ins {
            self.rec(t)?;
        }
        let add = func("graphAddNode", self.ctx.table().graphAddNode)?;
        let node = cname(name)?;
        // Only ids are read by graphAddNode, but the full descriptions are passed, as the header
        // shows; the pointers are into `self.tensors`, unchanged until the call returns.
        let mut raw_in: Vec<Qnn_Tensor_t> = ins
            .iter()
            .map(|t| self.tensors[t.index].raw(ptr::null_mut(), 0))
            .collect();
        let mut raw_out = [self.tensors[out.index].raw(ptr::null_mut(), 0)];
        let config = Qnn_OpConfig_t {
            version: QNN_OPCONFIG_VERSION_1,
            v1: Qnn_OpConfigV1_t {
                name: node.as_ptr(),
                packageName: QNN_OP_PACKAGE_NAME_QTI_AISW.as_ptr(),
                typeName: op.as_ptr(),
                numOfParams: 0,
                params: ptr::null_mut(),
                numOfInputs: raw_in.len() as u32,
                inputTensors: raw_in.as_mut_ptr(),
                numOfOutputs: 1,
                outputTensors: raw_out.as_mut_ptr(),
            },
        };
        // SAFETY: the graph handle is live; every pointer in `config` is to data alive for the call
        // (`node`, the static names, `raw_in`, `raw_out` and the records they point into).
        check("graphAddNode", unsafe { add(self.handle.0, config) })
    }

    fn same_dims(&self, name: &str, ts: &[Tensor]) -> Result<(), QnnError> {
        let d0 = self.dims(ts[0])?;
        for &t in &ts[1..] {
            if self.dims(t)? != d0 {
                return Err(shape(
                    name,
                    format!("shapes {:?} and {:?} differ", d0, self.dims(t)?),
                ));
            }
        }
        Ok(())
    }

    /// `FullyConnected`: `y = x · wᵀ (+ bias)`, x `[batch, in]`, w `[out, in]` (static, or a graph
    /// input given to each execution: weights streamed in, as a prompt step over a neuron store
    /// needs), bias `[out]` (static f32), y `[batch, out]`.
    pub fn fully_connected(
        &mut self,
        name: &str,
        x: Tensor,
        w: Tensor,
        bias: Option<Tensor>,
        y: Tensor,
    ) -> Result<(), QnnError> {
        let (xd, wd, yd) = (
            self.dims(x)?.to_vec(),
            self.dims(w)?.to_vec(),
            self.dims(y)?.to_vec(),
        );
        let kind = self.rec(w)?.kind;
        if !(kind == QNN_TENSOR_TYPE_STATIC || kind == QNN_TENSOR_TYPE_APP_WRITE) || wd.len() != 2 {
            return Err(shape(
                name,
                format!("weights {wd:?} must be a static or input [out, in] matrix"),
            ));
        }
        if xd.len() != 2 || xd[1] != wd[1] || yd != [xd[0], wd[0]] {
            return Err(shape(
                name,
                format!("x {xd:?} · w {wd:?}ᵀ does not give y {yd:?} ([batch, in] · [out, in]ᵀ = [batch, out])"),
            ));
        }
        let mut ins = vec![x, w];
        if let Some(b) = bias {
            let r = self.rec(b)?;
            if r.kind != QNN_TENSOR_TYPE_STATIC
                || r.dims != [wd[0]]
                || r.data_type != QNN_DATATYPE_FLOAT_32
            {
                return Err(shape(
                    name,
                    format!("bias {:?} must be static f32 [{}]", r.dims, wd[0]),
                ));
            }
            ins.push(b);
        }
        self.add_node(name, QNN_OP_FULLY_CONNECTED, &ins, y)
    }

    /// `ElementWiseMultiply`: `y = a ⊙ b` (equal shapes).
    pub fn multiply(
        &mut self,
        name: &str,
        a: Tensor,
        b: Tensor,
        y: Tensor,
    ) -> Result<(), QnnError> {
        self.same_dims(name, &[a, b, y])?;
        self.add_node(name, QNN_OP_ELEMENT_WISE_MULTIPLY, &[a, b], y)
    }

    /// `ElementWiseAdd`: `y = a + b` (equal shapes).
    pub fn add(&mut self, name: &str, a: Tensor, b: Tensor, y: Tensor) -> Result<(), QnnError> {
        self.same_dims(name, &[a, b, y])?;
        self.add_node(name, QNN_OP_ELEMENT_WISE_ADD, &[a, b], y)
    }

    /// `Sigmoid`: `y = 1 / (1 + e^-x)`.
    pub fn sigmoid(&mut self, name: &str, x: Tensor, y: Tensor) -> Result<(), QnnError> {
        self.same_dims(name, &[x, y])?;
        self.add_node(name, QNN_OP_SIGMOID, &[x], y)
    }

    /// `Relu`: `y = max(x, 0)`.
    pub fn relu(&mut self, name: &str, x: Tensor, y: Tensor) -> Result<(), QnnError> {
        self.same_dims(name, &[x, y])?;
        self.add_node(name, QNN_OP_RELU, &[x], y)
    }

    /// Finalizes the graph (QNN compiles it for the accelerator here); static data is released
    /// afterwards.
    pub fn finalize(&mut self) -> Result<(), QnnError> {
        if self.finalized {
            return Err(QnnError::State("graph finalized twice"));
        }
        let fin = func("graphFinalize", self.ctx.table().graphFinalize)?;
        // SAFETY: the graph handle is live; null profile and signal handles are allowed.
        check("graphFinalize", unsafe {
            fin(self.handle.0, ptr::null_mut(), ptr::null_mut())
        })?;
        self.finalized = true;
        for t in &mut self.tensors {
            t.data = Vec::new();
        }
        Ok(())
    }

    /// Runs the finalized graph: `inputs[i]` fills the i-th input made, `outputs[j]` receives the
    /// j-th output; every slice has exactly its tensor's element count.
    pub fn execute(
        &mut self,
        inputs: &[&[f32]],
        outputs: &mut [&mut [f32]],
    ) -> Result<(), QnnError> {
        if !self.finalized {
            return Err(QnnError::State("graph executed before finalize"));
        }
        let count = |what: &str, expected: usize, got: usize| {
            if expected == got {
                Ok(())
            } else {
                Err(QnnError::Length {
                    what: what.to_string(),
                    expected,
                    got,
                })
            }
        };
        count("graph inputs", self.inputs.len(), inputs.len())?;
        count("graph outputs", self.outputs.len(), outputs.len())?;
        let exec = func("graphExecute", self.ctx.table().graphExecute)?;
        let mut raw_in = Vec::with_capacity(inputs.len());
        for (&i, x) in self.inputs.clone().iter().zip(inputs) {
            let rec = &mut self.tensors[i];
            count(&format!("input {:?}", rec.name), rec.len(), x.len())?;
            let size =
                u32::try_from(x.len() * 4).map_err(|_| shape("input", "4 GiB or more".into()))?;
            // QNN reads inputs only (`const Qnn_Tensor_t*`); the pointer is mut by the struct's type.
            raw_in.push(rec.raw(x.as_ptr().cast_mut().cast(), size));
        }
        let mut raw_out = Vec::with_capacity(outputs.len());
        for (&o, y) in self.outputs.clone().iter().zip(outputs.iter_mut()) {
            let rec = &mut self.tensors[o];
            count(&format!("output {:?}", rec.name), rec.len(), y.len())?;
            let size =
                u32::try_from(y.len() * 4).map_err(|_| shape("output", "4 GiB or more".into()))?;
            raw_out.push(rec.raw(y.as_mut_ptr().cast(), size));
        }
        // SAFETY: the graph handle is live and finalized; `raw_in`/`raw_out` hold the stated counts
        // of tensors whose client buffers are the caller's slices, of exactly `dataSize` bytes,
        // borrowed (inputs shared, outputs exclusive) for the call; null profile/signal allowed.
        check("graphExecute", unsafe {
            exec(
                self.handle.0,
                raw_in.as_ptr(),
                raw_in.len() as u32,
                raw_out.as_mut_ptr(),
                raw_out.len() as u32,
                ptr::null_mut(),
                ptr::null_mut(),
            )
        })
    }
}
