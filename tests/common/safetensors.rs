//! Hand-written safetensors files: the tensors of a file as entries, and a writer, so that
//! the tests can edit, split and retype the reference checkpoints.

use std::path::Path;

use burn::store::{ModuleStore, SafetensorsStore};
use burn::tensor::DType;

/// One tensor of a hand-written safetensors file.
pub struct Entry {
    pub name: String,
    pub dtype: &'static str,
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

pub fn f32_entry(name: &str, shape: Vec<usize>, values: &[f32]) -> Entry {
    Entry {
        name: name.into(),
        dtype: "F32",
        shape,
        bytes: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

pub fn read_entries(file: &Path) -> Vec<Entry> {
    let mut store = SafetensorsStore::from_file(file);
    store
        .get_all_snapshots()
        .unwrap()
        .iter()
        .map(|(name, snap)| {
            let data = snap.to_data().unwrap();
            assert_eq!(data.dtype, DType::F32);
            f32_entry(name, data.shape.to_vec(), &data.to_vec::<f32>().unwrap())
        })
        .collect()
}

pub fn write_entries(file: &Path, entries: &[Entry]) {
    let mut header = String::from("{");
    let mut offset = 0;
    for (i, e) in entries.iter().enumerate() {
        if i > 0 {
            header.push(',');
        }
        header.push_str(&format!(
            "\"{}\":{{\"dtype\":\"{}\",\"shape\":{:?},\"data_offsets\":[{},{}]}}",
            e.name,
            e.dtype,
            e.shape,
            offset,
            offset + e.bytes.len()
        ));
        offset += e.bytes.len();
    }
    header.push('}');
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    for e in entries {
        out.extend_from_slice(&e.bytes);
    }
    std::fs::write(file, out).unwrap();
}
