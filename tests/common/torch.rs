//! A `torch.save` writer for the tests, so that `pytorch_model.bin` folders can be made from the
//! reference cases without PyTorch: the zip archive PyTorch (1.6 on) writes, its entries
//! stored uncompressed: `archive/data.pkl`, a protocol-2 pickle of an `OrderedDict` whose
//! values are rebuilt by `torch._utils._rebuild_tensor_v2` from storages named by persistent
//! ids, `archive/data/{key}` with each storage's little-endian bytes, `archive/byteorder` and
//! `archive/version`.

use std::io::Write;
use std::path::Path;

/// One tensor of a state dict: its name, PyTorch storage type (`FloatStorage`, `HalfStorage`,
/// `BFloat16Storage`), shape and little-endian bytes (contiguous).
pub struct TorchTensor {
    pub name: String,
    pub storage: &'static str,
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

/// The pickle opcodes the writer uses.
mod op {
    pub const PROTO: u8 = 0x80;
    pub const GLOBAL: u8 = b'c';
    pub const EMPTY_TUPLE: u8 = b')';
    pub const REDUCE: u8 = b'R';
    pub const MARK: u8 = b'(';
    pub const TUPLE: u8 = b't';
    pub const BINUNICODE: u8 = b'X';
    pub const BININT: u8 = b'J';
    pub const BINPERSID: u8 = b'Q';
    pub const NEWFALSE: u8 = 0x89;
    pub const SETITEMS: u8 = b'u';
    pub const STOP: u8 = b'.';
}

fn global(out: &mut Vec<u8>, module: &str, name: &str) {
    out.push(op::GLOBAL);
    out.extend_from_slice(format!("{module}\n{name}\n").as_bytes());
}

fn string(out: &mut Vec<u8>, s: &str) {
    out.push(op::BINUNICODE);
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn int(out: &mut Vec<u8>, v: usize) {
    out.push(op::BININT);
    out.extend_from_slice(&i32::try_from(v).expect("fits i32").to_le_bytes());
}

fn int_tuple(out: &mut Vec<u8>, values: &[usize]) {
    out.push(op::MARK);
    for &v in values {
        int(out, v);
    }
    out.push(op::TUPLE);
}

/// An empty `collections.OrderedDict()`.
fn ordered_dict(out: &mut Vec<u8>) {
    global(out, "collections", "OrderedDict");
    out.push(op::EMPTY_TUPLE);
    out.push(op::REDUCE);
}

/// The state dict's pickle: storage `i` of tensor `i` is `archive/data/{i}`.
fn pickle(tensors: &[TorchTensor]) -> Vec<u8> {
    let mut out = vec![op::PROTO, 2];
    ordered_dict(&mut out);
    out.push(op::MARK);
    for (key, t) in tensors.iter().enumerate() {
        let width = match t.storage {
            "FloatStorage" => 4,
            "HalfStorage" | "BFloat16Storage" => 2,
            other => panic!("storage {other} not written"),
        };
        let numel: usize = t.shape.iter().product();
        assert_eq!(
            t.bytes.len(),
            numel * width,
            "{}: bytes for its shape",
            t.name
        );
        let mut strides = vec![1; t.shape.len()];
        for d in (0..t.shape.len().saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * t.shape[d + 1];
        }
        string(&mut out, &t.name);
        global(&mut out, "torch._utils", "_rebuild_tensor_v2");
        out.push(op::MARK);
        // the storage, by persistent id: ('storage', type, key, location, numel)
        out.push(op::MARK);
        string(&mut out, "storage");
        global(&mut out, "torch", t.storage);
        string(&mut out, &key.to_string());
        string(&mut out, "cpu");
        int(&mut out, numel);
        out.push(op::TUPLE);
        out.push(op::BINPERSID);
        int(&mut out, 0); // storage offset
        int_tuple(&mut out, &t.shape);
        int_tuple(&mut out, &strides);
        out.push(op::NEWFALSE); // requires_grad
        ordered_dict(&mut out); // backward hooks
        out.push(op::TUPLE);
        out.push(op::REDUCE);
    }
    out.push(op::SETITEMS);
    out.push(op::STOP);
    out
}

/// Writes `tensors` to `file` as `torch.save(state_dict)` does.
pub fn write_torch(file: &Path, tensors: &[TorchTensor]) {
    let mut zip = zip::ZipWriter::new(std::fs::File::create(file).unwrap());
    let stored =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    let mut entry = |name: &str, bytes: &[u8]| {
        zip.start_file(format!("archive/{name}"), stored).unwrap();
        zip.write_all(bytes).unwrap();
    };
    entry("data.pkl", &pickle(tensors));
    entry("byteorder", b"little");
    for (key, t) in tensors.iter().enumerate() {
        entry(&format!("data/{key}"), &t.bytes);
    }
    entry("version", b"3\n");
    zip.finish().unwrap();
}
