//! Which release of Infera's own parts a role's engine pods run, decided so that an
//! operator upgrade restarts no engine (pure).
//!
//! An engine pod holds a model that took minutes to load. The operator therefore renders
//! engine pod templates *per release*: what that release's sidecar, kvd and node-env
//! accept, with that release's images. Each engine workload records, on its own metadata
//! (never in its pod template), the release its pods run and a digest of the template
//! they were given ([`PLATFORM_ANNOTATION`], [`TEMPLATE_DIGEST_ANNOTATION`]). On every
//! reconcile, per role:
//!
//! 1. `spec.platform.version` names a release the pods do not run: that release (the
//!    user asked; the pods roll onto it);
//! 2. otherwise the workload's release is *kept* (a workload the 0.1.0 operator made
//!    records none and runs 0.1.0, with the images its pods have): the role is rendered
//!    under it, and when that gives the recorded template (or none is recorded), that is
//!    what is applied: the same template, no restart;
//! 3. otherwise the engine spec changed, and the pods roll anyway: onto the pinned
//!    release, else the operator's own ([`PlatformVersion::CURRENT`]). New deployments
//!    start there too.
//!
//! The render side of the rule is in `render::workers`. Every change to how engine pods
//! are rendered is made for a new release and gated on it
//! ([`PlatformVersion::at_least`]); `operator/snapshots/platform-<release>/` pins each
//! release's templates of every example byte for byte.

use crate::api::PlatformVersion;
use crate::plan::Images;

/// The engine workload's annotation naming the release its pods run.
pub const PLATFORM_ANNOTATION: &str = "infera.amd.com/platform-version";
/// The engine workload's annotation holding the digest of the pod template it was given.
pub const TEMPLATE_DIGEST_ANNOTATION: &str = "infera.amd.com/engine-template-digest";

/// What a role's engine pods run of Infera's: a release and its images.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnginePlatform {
    /// The release (how the pod template is rendered).
    pub version: PlatformVersion,
    /// `infera-engine-sidecar` (also the node-env init container's).
    pub sidecar: String,
    /// `infera-kvd`.
    pub kvd: String,
    /// `infera-sim`, the engine of `kind: sim` without an image of its own.
    pub sim: String,
    /// `infera-gateway`, the direct-mode frontend of decode pods behind an
    /// InferencePool.
    pub gateway: String,
}

/// An engine workload as it stands: what the operator recorded on it, and the images
/// its pod template holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LiveEngines {
    /// [`PLATFORM_ANNOTATION`], parsed; `None` when absent (a 0.1.0 workload) or naming
    /// a release this operator does not know.
    pub version: Option<PlatformVersion>,
    /// Whether the annotation was there at all (an unknown release is not 0.1.0).
    pub recorded: bool,
    /// [`TEMPLATE_DIGEST_ANNOTATION`].
    pub template_digest: Option<String>,
    /// The image of the container named `sidecar`.
    pub sidecar: Option<String>,
    /// The image of the container named `kvd`.
    pub kvd: Option<String>,
    /// The image of the container named `engine`.
    pub engine: Option<String>,
    /// The image of the container named `frontend`.
    pub frontend: Option<String>,
    /// A StatefulSet's window and pods (a LeaderWorkerSet rolls by itself).
    pub workers: Option<crate::plan::rollout::LiveWorkers>,
}

/// The releases a role may be rendered with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlatformChoice {
    /// What the pods run now, with the digest recorded for it: applied when rendering
    /// under it gives that digest (or none was recorded).
    pub kept: Option<(EnginePlatform, Option<String>)>,
    /// Otherwise: the pinned release, else the operator's.
    pub target: EnginePlatform,
}

impl PlatformChoice {
    /// A role with no workload yet: the target alone.
    pub fn new_role(target: EnginePlatform) -> Self {
        Self { kept: None, target }
    }
}

/// Release `version`'s platform: the operator's images for its own release, else
/// `<registry>/infera-<part>:<version>`.
pub fn build_release_platform(
    version: PlatformVersion,
    current: &Images,
    registry: &str,
) -> EnginePlatform {
    let images = if version == PlatformVersion::CURRENT {
        current.clone()
    } else {
        Images::from_registry(registry, version.as_str())
    };
    EnginePlatform {
        version,
        sidecar: images.sidecar,
        kvd: images.kvd,
        sim: images.sim,
        gateway: images.gateway,
    }
}

/// The choice for one role (rule 1 to 3 of the module doc): `pin` is
/// `spec.platform.version`, `live` the role's workload if it exists, `sim_engine`
/// whether its engine container runs Infera's simulator image (`kind: sim` without an
/// image of its own).
pub fn choose_platform(
    pin: Option<PlatformVersion>,
    live: Option<&LiveEngines>,
    sim_engine: bool,
    current: &Images,
    registry: &str,
) -> PlatformChoice {
    let target = build_release_platform(pin.unwrap_or(PlatformVersion::CURRENT), current, registry);
    let Some(live) = live else {
        return PlatformChoice::new_role(target);
    };
    // A release this operator does not know (a newer operator's, rolled back): nothing
    // to keep; the pods move to the target.
    let Some(version) = live
        .version
        .or((!live.recorded).then_some(PlatformVersion::V0_1_0))
    else {
        return PlatformChoice::new_role(target);
    };
    if pin.is_some_and(|p| p != version) {
        return PlatformChoice::new_role(target);
    }
    let defaults = build_release_platform(version, current, registry);
    let kept = EnginePlatform {
        version,
        sidecar: live.sidecar.clone().unwrap_or(defaults.sidecar),
        kvd: live.kvd.clone().unwrap_or(defaults.kvd),
        sim: match (&live.engine, sim_engine) {
            (Some(image), true) => image.clone(),
            _ => defaults.sim,
        },
        gateway: live.frontend.clone().unwrap_or(defaults.gateway),
    };
    PlatformChoice {
        kept: Some((kept, live.template_digest.clone())),
        target,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn current() -> Images {
        Images::from_registry("registry.test/infera", "0.2.0")
    }

    fn legacy() -> LiveEngines {
        LiveEngines {
            sidecar: Some("registry.test/infera/infera-engine-sidecar:0.1.0".into()),
            kvd: Some("registry.test/infera/infera-kvd:0.1.0".into()),
            engine: Some("registry.test/infera/infera-sim:0.1.0".into()),
            ..Default::default()
        }
    }

    #[test]
    fn a_new_role_gets_the_pinned_release_or_the_operators() {
        let c = choose_platform(None, None, true, &current(), "registry.test/infera");
        assert_eq!(c.kept, None);
        assert_eq!(c.target.version, PlatformVersion::CURRENT);
        assert_eq!(c.target.sidecar, current().sidecar);
        let c = choose_platform(
            Some(PlatformVersion::V0_1_0),
            None,
            true,
            &current(),
            "registry.test/infera",
        );
        assert_eq!(c.target.version, PlatformVersion::V0_1_0);
        assert_eq!(
            c.target.sim, "registry.test/infera/infera-sim:0.1.0",
            "an older release's images by its tag"
        );
    }

    #[test]
    fn a_workload_without_a_record_keeps_0_1_0_with_its_own_images() {
        let c = choose_platform(None, Some(&legacy()), true, &current(), "elsewhere");
        let (kept, digest) = c.kept.unwrap();
        assert_eq!(kept.version, PlatformVersion::V0_1_0);
        assert_eq!(
            kept.sidecar,
            "registry.test/infera/infera-engine-sidecar:0.1.0"
        );
        assert_eq!(kept.sim, "registry.test/infera/infera-sim:0.1.0");
        assert_eq!(digest, None);
        assert_eq!(c.target.version, PlatformVersion::CURRENT);
        // A real engine's image is the vendor's, not the simulator's.
        let c = choose_platform(None, Some(&legacy()), false, &current(), "elsewhere");
        assert_eq!(c.kept.unwrap().0.sim, "elsewhere/infera-sim:0.1.0");
    }

    #[test]
    fn a_recorded_release_is_kept_until_the_pin_names_another() {
        let live = LiveEngines {
            version: Some(PlatformVersion::V0_1_0),
            recorded: true,
            template_digest: Some("abc".into()),
            ..legacy()
        };
        let c = choose_platform(
            Some(PlatformVersion::V0_1_0),
            Some(&live),
            true,
            &current(),
            "r",
        );
        assert_eq!(
            c.kept.as_ref().map(|(k, d)| (k.version, d.as_deref())),
            Some((PlatformVersion::V0_1_0, Some("abc")))
        );
        let c = choose_platform(
            Some(PlatformVersion::V0_2_0),
            Some(&live),
            true,
            &current(),
            "r",
        );
        assert_eq!(c.kept, None, "the user asked for 0.2.0");
        assert_eq!(c.target.version, PlatformVersion::V0_2_0);
    }

    #[test]
    fn an_unknown_recorded_release_is_not_kept() {
        let live = LiveEngines {
            recorded: true,
            ..legacy()
        };
        let c = choose_platform(None, Some(&live), true, &current(), "r");
        assert_eq!(c.kept, None);
        assert_eq!(c.target.version, PlatformVersion::CURRENT);
    }
}
