//! The one trait every throwaway world implements.
//!
//! A [`Topology`] is a description of a world (which pods, which mode, which plugin path):
//! [`Topology::probe`] says whether this machine can build it (`Err(reason)` to skip, never a
//! silent pass), [`Topology::build`] makes it and returns a guard that tears it down on drop,
//! in the order the implementor documents. Implemented here for the two-host pod world
//! ([`crate::pods::PodsSpec`]), the reference-ptp world ([`crate::ptp::PtpSpec`]), the rootless
//! world ([`crate::rootless::WorldOpts`]) and the veth pair ([`crate::world::VethSpec`]); bench's
//! registry entries (`nsfast_bench::topology::TopologyDef`) implement it for their runs.

/// A buildable throwaway world.
pub trait Topology {
    /// What a build needs besides the description (a name prefix, a run context).
    type Ctx: ?Sized;
    /// The built world; dropping it tears the world down.
    type Guard;
    /// Why a build failed (what was made until then is already torn down).
    type Error;

    /// Short name, for messages.
    fn name(&self) -> &str;

    /// `Ok` when this machine can build the world, else the reason to skip it.
    fn probe(&self) -> Result<(), String> {
        Ok(())
    }

    /// Builds the world.
    fn build(&self, ctx: &Self::Ctx) -> Result<Self::Guard, Self::Error>;

    /// For root tests, which never pass by skipping: [`Topology::probe`] then
    /// [`Topology::build`], panicking with the probe's reason or the build's error.
    fn expect_built(&self, ctx: &Self::Ctx) -> Self::Guard
    where
        Self::Error: std::fmt::Display,
    {
        if let Err(why) = self.probe() {
            panic!("cannot build the {} world here: {why}", self.name());
        }
        self.build(ctx)
            .unwrap_or_else(|e| panic!("building the {} world: {e:#}", self.name()))
    }
}
