//! Files read a range at a time: what a model loaded without holding its files reads each
//! tensor from (a `File` or a stored download in the page), and the tensors it reads, a group
//! at a time.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;

use crate::error::Result;
use crate::model::weights::{ModelWeights, Tensor};

/// A future that borrows what made it and need not be `Send` (a browser's promises are not).
pub type LocalFuture<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// The files of one model, each read a byte range at a time.
pub trait ByteSource {
    /// Bytes `range` of file `file` (an index into the files the source was opened with);
    /// exactly `range.end - range.start` of them, or an error naming the file.
    fn read(&self, file: usize, range: std::ops::Range<u64>) -> LocalFuture<'_, Result<Vec<u8>>>;

    /// The most bytes worth reading in one call to save calls: a reader asks for neighbouring
    /// ranges of one file together (and for the small gaps between them) up to this many
    /// bytes. 0 (the default) reads each range on its own, for sources where a call costs
    /// little (a `File`); a source where each call is a round trip (HTTP) says more. A merged
    /// read is held while its tensors are copied out of it: up to this many bytes beside them.
    fn merge_up_to(&self) -> u64 {
        0
    }
}

/// The tensors of a model read on demand: a backend that uploads a group at a time asks for
/// each group, and drops its bytes once they are on the device.
pub trait TensorReader {
    /// The tensors `names` (as the model's weights name them), with their bytes.
    fn read_tensors<'a>(
        &'a self,
        names: &'a [String],
    ) -> LocalFuture<'a, Result<BTreeMap<String, Tensor<'static>>>>;
}

/// The tensors of the model `layout` describes in the groups a loader reads them in: each
/// layer's together (`Some(layer)`: its fused tensors need every part, and a source that
/// merges neighbouring reads serves a layer in a few calls), every tensor outside the layers
/// on its own (`None`). In layer order, the others first.
pub fn read_groups(layout: &ModelWeights<'_>) -> Vec<(Option<usize>, Vec<String>)> {
    let layer_of = |name: &str| -> Option<usize> {
        let rest = name.strip_prefix("blk.")?;
        rest.split_once('.')?.0.parse().ok()
    };
    let mut layers: BTreeMap<Option<usize>, Vec<String>> = BTreeMap::new();
    for name in layout.tensors.keys() {
        layers.entry(layer_of(name)).or_default().push(name.clone());
    }
    let mut groups = Vec::new();
    for (layer, names) in layers {
        match layer {
            Some(_) => groups.push((layer, names)),
            None => groups.extend(names.into_iter().map(|n| (None, vec![n]))),
        }
    }
    groups
}
