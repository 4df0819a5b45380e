//! A graph of the double: tensors by id, nodes in the order added, checked as QNN would check them
//! (known op of the `qti.aisw` package, shapes, dependency order), executed with [`crate::compute`].

use std::collections::HashMap;

use npu_qnn_sys::*;

use crate::compute;
use crate::tensors::TensorObj;

/// The ops the double supports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    FullyConnected,
    Multiply,
    Add,
    Sigmoid,
    Relu,
}

impl Op {
    /// The op of a `qti.aisw` type name.
    pub fn from_name(name: &[u8]) -> Option<Op> {
        Some(match name {
            b"FullyConnected" => Op::FullyConnected,
            b"ElementWiseMultiply" => Op::Multiply,
            b"ElementWiseAdd" => Op::Add,
            b"Sigmoid" => Op::Sigmoid,
            b"Relu" => Op::Relu,
            _ => return None,
        })
    }
}

pub(crate) struct Node {
    op: Op,
    inputs: Vec<u32>,
    output: u32,
}

pub(crate) struct GraphObj {
    pub context: usize,
    pub name: String,
    tensors: HashMap<u32, TensorObj>,
    next_id: u32,
    nodes: Vec<Node>,
    pub finalized: bool,
}

impl GraphObj {
    pub fn new(context: usize, name: String) -> Self {
        Self {
            context,
            name,
            tensors: HashMap::new(),
            next_id: 1,
            nodes: Vec::new(),
            finalized: false,
        }
    }

    /// Registers a tensor; returns its id.
    pub fn add_tensor(&mut self, t: TensorObj) -> Result<u32, u64> {
        if self.finalized {
            return Err(QNN_GRAPH_ERROR_GRAPH_FINALIZED);
        }
        if self.tensors.values().any(|x| x.name == t.name) {
            return Err(QNN_GRAPH_ERROR_INVALID_NAME);
        }
        let id = self.next_id;
        self.next_id += 1;
        self.tensors.insert(id, t);
        Ok(id)
    }

    fn dims(&self, id: u32) -> &[u32] {
        &self.tensors[&id].dims
    }

    /// Checks and appends a node; `Err` is the QNN error code `graphAddNode` returns.
    pub fn add_node(
        &mut self,
        op: Op,
        inputs: &[u32],
        outputs: &[u32],
        num_params: u32,
    ) -> Result<(), u64> {
        if self.finalized {
            return Err(QNN_GRAPH_ERROR_GRAPH_FINALIZED);
        }
        for id in inputs.iter().chain(outputs) {
            if !self.tensors.contains_key(id) {
                return Err(QNN_GRAPH_ERROR_INVALID_TENSOR);
            }
        }
        for id in inputs {
            let t = &self.tensors[id];
            if matches!(t.kind, QNN_TENSOR_TYPE_NATIVE | QNN_TENSOR_TYPE_APP_READ) && !t.produced {
                return Err(QNN_GRAPH_ERROR_UNCONNECTED_NODE);
            }
        }
        let bad = Err(QNN_GRAPH_ERROR_INVALID_OP_CONFIG);
        let [output] = outputs else { return bad };
        let out = &self.tensors[output];
        if !matches!(out.kind, QNN_TENSOR_TYPE_NATIVE | QNN_TENSOR_TYPE_APP_READ) || out.produced {
            return Err(QNN_GRAPH_ERROR_INVALID_TENSOR);
        }
        let same = |a: u32, b: u32| self.dims(a) == self.dims(b);
        let ok = match op {
            Op::FullyConnected => {
                // `keep_dims` (false by default) is the only parameter; the double keeps 2-D outputs.
                num_params <= 1 && self.fc_shapes(inputs, *output)
            }
            Op::Multiply | Op::Add => {
                num_params == 0
                    && inputs.len() == 2
                    && same(inputs[0], inputs[1])
                    && same(inputs[0], *output)
            }
            Op::Sigmoid | Op::Relu => {
                num_params == 0 && inputs.len() == 1 && same(inputs[0], *output)
            }
        };
        if !ok {
            return bad;
        }
        if let Some(t) = self.tensors.get_mut(output) {
            t.produced = true;
        }
        self.nodes.push(Node {
            op,
            inputs: inputs.to_vec(),
            output: *output,
        });
        Ok(())
    }

    /// FullyConnected: `in[0]` `[.., in]` (flattened to rows of `in`), `in[1]` `[out, in]` static or
    /// a graph input, optional `in[2]` `[out]` static; out `[rows, out]`.
    fn fc_shapes(&self, inputs: &[u32], output: u32) -> bool {
        if !(2..=3).contains(&inputs.len()) {
            return false;
        }
        let (x, w, y) = (
            self.dims(inputs[0]),
            self.dims(inputs[1]),
            self.dims(output),
        );
        let [o, i] = *w else { return false };
        let xn: u64 = x.iter().map(|&d| d as u64).product();
        let weights = &self.tensors[&inputs[1]];
        let given = weights.values.is_some() || weights.kind == QNN_TENSOR_TYPE_APP_WRITE;
        if x.is_empty() || x[x.len() - 1] != i || !given {
            return false;
        }
        let rows = xn / i as u64;
        if inputs.len() == 3 {
            let b = &self.tensors[&inputs[2]];
            if b.dims != [o] || b.values.is_none() {
                return false;
            }
        }
        y == [rows as u32, o]
    }

    /// `graphFinalize`'s checks.
    pub fn finalize(&mut self) -> Result<(), u64> {
        if self.finalized {
            return Err(QNN_GRAPH_ERROR_GRAPH_FINALIZED);
        }
        let unwritten = self
            .tensors
            .values()
            .any(|t| t.kind == QNN_TENSOR_TYPE_APP_READ && !t.produced);
        if self.nodes.is_empty() || unwritten {
            return Err(QNN_GRAPH_ERROR_FINALIZE_FAILED);
        }
        self.finalized = true;
        Ok(())
    }

    /// The tensor with `id`, if it has type `kind`.
    pub fn tensor_of_kind(&self, id: u32, kind: Qnn_TensorType_t) -> Option<&TensorObj> {
        self.tensors.get(&id).filter(|t| t.kind == kind)
    }

    /// Ids of the tensors of type `kind`.
    pub fn ids_of_kind(&self, kind: Qnn_TensorType_t) -> Vec<u32> {
        let mut v: Vec<u32> = self
            .tensors
            .iter()
            .filter(|(_, t)| t.kind == kind)
            .map(|(&id, _)| id)
            .collect();
        v.sort_unstable();
        v
    }

    /// Runs the nodes on `inputs` (id → values); returns every computed tensor by id.
    pub fn run(&self, inputs: HashMap<u32, Vec<f32>>) -> HashMap<u32, Vec<f32>> {
        let mut vals = inputs;
        for n in &self.nodes {
            let get = |id: u32| -> &[f32] {
                match self.tensors[&id].values.as_deref() {
                    Some(v) => v,
                    None => &vals[&id],
                }
            };
            let y = match n.op {
                Op::FullyConnected => {
                    let w = self.dims(n.inputs[1]);
                    let (out, inp) = (w[0] as usize, w[1] as usize);
                    let x = get(n.inputs[0]);
                    let bias = n.inputs.get(2).map(|&b| get(b));
                    compute::fully_connected(x, get(n.inputs[1]), bias, x.len() / inp, inp, out)
                }
                Op::Multiply => compute::multiply(get(n.inputs[0]), get(n.inputs[1])),
                Op::Add => compute::add(get(n.inputs[0]), get(n.inputs[1])),
                Op::Sigmoid => compute::sigmoid(get(n.inputs[0])),
                Op::Relu => compute::relu(get(n.inputs[0])),
            };
            vals.insert(n.output, y);
        }
        vals
    }
}
