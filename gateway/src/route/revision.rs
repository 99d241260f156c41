//! Pairing prefill and decode workers of one revision (pure). While an engine change
//! rolls, a deployment runs two revisions of its engine spec side by side; a prefill of
//! the new one must not hand its KV to a decode of the old one (the KV layout may have
//! changed). Workers name their revision in their record
//! ([`infera_proto::worker::REVISION_FIELD`]); one that names none (the earlier
//! system's, or one started by hand) pairs with any.

use crate::workers::registry::Target;
use std::borrow::Cow;

/// Whether every worker of both pools pairs with every other: one revision, or none
/// named (the case outside a rollout, checked without allocating).
fn one_revision(prefill: &[Target], decode: &[Target]) -> bool {
    let mut named = prefill
        .iter()
        .chain(decode)
        .filter_map(|t| t.record.revision());
    match named.next() {
        None => true,
        Some(first) => named.all(|r| r == first),
    }
}

/// The prefill candidates that have a decode candidate of their revision. Empty when no
/// prefill and decode worker of one revision exist.
pub(crate) fn pairable_prefills<'t>(prefill: &'t [Target], decode: &[Target]) -> Cow<'t, [Target]> {
    if one_revision(prefill, decode) {
        return Cow::Borrowed(prefill);
    }
    Cow::Owned(
        prefill
            .iter()
            .filter(|p| decode.iter().any(|d| p.record.pairs_with(&d.record)))
            .cloned()
            .collect(),
    )
}

/// The decode candidates of `prefill`'s revision.
pub(crate) fn decodes_for<'t>(prefill: &Target, decode: &'t [Target]) -> Cow<'t, [Target]> {
    if decode.iter().all(|d| prefill.record.pairs_with(&d.record)) {
        return Cow::Borrowed(decode);
    }
    Cow::Owned(
        decode
            .iter()
            .filter(|d| prefill.record.pairs_with(&d.record))
            .cloned()
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use infera_proto::worker::WorkerRecord;
    use std::sync::Arc;

    fn target(id: &str, mode: &str, revision: Option<&str>) -> Target {
        let mut record = WorkerRecord::from_json(
            format!(
                r#"{{"worker_id":"{id}","url":"http://{id}","model_name":"m","engine":"sglang","disagg_mode":"{mode}"}}"#
            )
            .as_bytes(),
        )
        .unwrap();
        if let Some(r) = revision {
            record.set_revision(r);
        }
        Target {
            key: id.to_owned(),
            record: Arc::new(record),
            dp_rank: None,
        }
    }

    fn ids(targets: &[Target]) -> Vec<&str> {
        targets.iter().map(|t| t.key.as_str()).collect()
    }

    #[test]
    fn one_revision_keeps_the_pools_as_they_are() {
        let prefill = [
            target("p1:1", "prefill", Some("a")),
            target("p2:1", "prefill", None),
        ];
        let decode = [target("d1:1", "decode", Some("a"))];
        assert!(matches!(
            pairable_prefills(&prefill, &decode),
            Cow::Borrowed(_)
        ));
        assert!(matches!(
            decodes_for(&prefill[0], &decode),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn two_revisions_pair_only_within_one() {
        // Mid-rollout: the old revision has lost its last decode, the new one has both.
        let prefill = [
            target("old-p:1", "prefill", Some("old")),
            target("new-p:1", "prefill", Some("new")),
        ];
        let decode = [target("new-d:1", "decode", Some("new"))];
        assert_eq!(ids(&pairable_prefills(&prefill, &decode)), ["new-p:1"]);
        let decode = [
            target("old-d:1", "decode", Some("old")),
            target("new-d:1", "decode", Some("new")),
            target("hand-d:1", "decode", None),
        ];
        assert_eq!(
            ids(&pairable_prefills(&prefill, &decode)),
            ["old-p:1", "new-p:1"]
        );
        assert_eq!(
            ids(&decodes_for(&prefill[0], &decode)),
            ["old-d:1", "hand-d:1"]
        );
        assert_eq!(
            ids(&decodes_for(&prefill[1], &decode)),
            ["new-d:1", "hand-d:1"]
        );
    }

    #[test]
    fn no_pair_of_one_revision_leaves_no_prefill() {
        let prefill = [target("p:1", "prefill", Some("new"))];
        let decode = [target("d:1", "decode", Some("old"))];
        assert!(pairable_prefills(&prefill, &decode).is_empty());
    }
}
