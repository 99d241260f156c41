//! Apply and prune: every desired child goes through server-side apply with the field
//! manager `infera-operator` (an unchanged child is a no-op for the API server: its
//! `resourceVersion` stays); children that carry the instance labels and this
//! deployment's owner reference but were not built are deleted.

use crate::names::{FIELD_MANAGER, children_selector};
use crate::render::{Child, Kind};
use kube::Client;
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PropagationPolicy,
};
use std::collections::BTreeSet;

/// An API call that failed, naming the object.
#[derive(Debug, thiserror::Error)]
#[error("{action} {kind:?} {name}: {source}")]
pub struct ApplyError {
    /// apply, delete or list.
    pub action: &'static str,
    /// Kind.
    pub kind: Kind,
    /// Object name.
    pub name: String,
    /// The API error.
    #[source]
    pub source: kube::Error,
}

fn api(client: &Client, namespace: &str, kind: Kind) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), namespace, &kind.api_resource())
}

/// A child as the API server returned it after the apply.
#[derive(Debug, Clone)]
pub struct Applied {
    /// Kind.
    pub kind: Kind,
    /// Name.
    pub name: String,
    /// The stored object (with its status).
    pub object: DynamicObject,
}

fn is_immutable_field_error(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 422 && s.message.contains("immutable"))
}

/// Applies one child. A Job whose template changed cannot be updated in place: it is
/// deleted, and the next reconcile creates the new one (`Ok(None)`).
pub async fn apply_child(
    client: &Client,
    namespace: &str,
    child: &Child,
) -> Result<Option<Applied>, ApplyError> {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let api = api(client, namespace, child.kind);
    if child.kind == Kind::PersistentVolumeClaim {
        // A claim's spec is immutable once bound: created once, never re-applied (a
        // changed storage class would otherwise fail every reconcile).
        let existing = api
            .get_opt(&child.name)
            .await
            .map_err(|source| ApplyError {
                action: "read",
                kind: child.kind,
                name: child.name.clone(),
                source,
            })?;
        if let Some(object) = existing {
            return Ok(Some(Applied {
                kind: child.kind,
                name: child.name.clone(),
                object,
            }));
        }
    }
    match api
        .patch(&child.name, &params, &Patch::Apply(&child.object))
        .await
    {
        Ok(object) => Ok(Some(Applied {
            kind: child.kind,
            name: child.name.clone(),
            object,
        })),
        Err(e) if child.kind == Kind::Job && is_immutable_field_error(&e) => {
            tracing::info!(job = %child.name, "the download Job changed; replacing it");
            let dp = DeleteParams {
                propagation_policy: Some(PropagationPolicy::Background),
                ..Default::default()
            };
            api.delete(&child.name, &dp)
                .await
                .map_err(|source| ApplyError {
                    action: "delete",
                    kind: child.kind,
                    name: child.name.clone(),
                    source,
                })?;
            Ok(None)
        }
        Err(source) => Err(ApplyError {
            action: "apply",
            kind: child.kind,
            name: child.name.clone(),
            source,
        }),
    }
}

/// Deletes children of `instance` (uid `owner_uid`) of the given kinds that are not in
/// `keep`; returns what was deleted.
pub async fn prune(
    client: &Client,
    namespace: &str,
    instance: &str,
    owner_uid: &str,
    kinds: &[Kind],
    keep: &BTreeSet<(Kind, String)>,
) -> Result<Vec<(Kind, String)>, ApplyError> {
    let selector = children_selector(instance);
    let mut deleted = Vec::new();
    for &kind in kinds.iter().filter(|k| k.pruned()) {
        let api = api(client, namespace, kind);
        let list = api
            .list_metadata(&ListParams::default().labels(&selector))
            .await
            .map_err(|source| ApplyError {
                action: "list",
                kind,
                name: selector.clone(),
                source,
            })?;
        for item in list.items {
            let Some(name) = item.metadata.name.clone() else {
                continue;
            };
            let owned = item
                .metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.uid == owner_uid);
            if !owned || keep.contains(&(kind, name.clone())) {
                continue;
            }
            let dp = DeleteParams {
                propagation_policy: Some(PropagationPolicy::Background),
                ..Default::default()
            };
            match api.delete(&name, &dp).await {
                Ok(_) => deleted.push((kind, name)),
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(source) => {
                    return Err(ApplyError {
                        action: "delete",
                        kind,
                        name,
                        source,
                    });
                }
            }
        }
    }
    Ok(deleted)
}
