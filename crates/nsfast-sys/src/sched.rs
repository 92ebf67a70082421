//! CPU placement: pin the calling process (or a child before exec) to one CPU, list the CPUs
//! this process may run on.

use std::io;

/// Pins the calling thread (and so a single-threaded process) to `cpu`.
pub fn pin_to_cpu(cpu: usize) -> io::Result<()> {
    set_affinity_raw(cpu)
}

/// Pins the calling process to `cpu` using only async-signal-safe calls, for `pre_exec`.
pub fn set_affinity_raw(cpu: usize) -> io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        // No allocation here: this runs in pre_exec too.
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: cpu_set_t is plain data for which all-zero is the valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid cpu_set_t and `cpu` was checked against CPU_SETSIZE.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: pid 0 means the calling thread; the pointer and size describe `set`.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The CPUs the calling thread may run on, in ascending order.
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    // SAFETY: cpu_set_t is plain data for which all-zero is the valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 means the calling thread; the kernel writes at most size_of bytes to `set`.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((0..libc::CPU_SETSIZE as usize)
        // SAFETY: `set` is initialised and `c` is below CPU_SETSIZE.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

/// The CPU the calling thread runs on right now.
pub fn current_cpu() -> Option<usize> {
    // SAFETY: sched_getcpu takes no arguments and only returns a number.
    let c = unsafe { libc::sched_getcpu() };
    usize::try_from(c).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_and_reports() {
        let cpus = allowed_cpus().unwrap();
        assert!(!cpus.is_empty());
        let first = cpus[0];
        std::thread::spawn(move || {
            pin_to_cpu(first).unwrap();
            assert_eq!(allowed_cpus().unwrap(), vec![first]);
            assert_eq!(current_cpu(), Some(first));
        })
        .join()
        .unwrap();
        assert!(pin_to_cpu(usize::MAX).is_err());
    }
}
