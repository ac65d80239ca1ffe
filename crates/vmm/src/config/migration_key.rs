//! The pre-shared key of authenticated migrations (`--migration-key
//! FILE`): a host setting, never saved or sent. How it is used on the
//! wire: `migration/auth.rs`.

use std::io::{self, Read};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

/// Fewest bytes of secret a key file holds.
pub const MIN_SECRET: usize = 32;
/// Fewest different byte values a secret holds: a simple test that it was
/// not typed or padded (`hover migration-key` writes 64 hex digits, all
/// 16 of them almost surely there).
pub const MIN_DISTINCT: usize = 8;
/// Most bytes a key file may hold (it is a secret, not a document).
const MAX_KEY_FILE: u64 = 4096;
const KEY_CONTEXT: &str = "hover 2026-11-25 migration pre-shared key";

/// A pre-shared migration key (`--migration-key FILE`), derived from the
/// file's secret. Its `Debug` never shows it.
#[derive(Clone)]
pub struct MigrationKey([u8; 32]);

impl std::fmt::Debug for MigrationKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MigrationKey(..)")
    }
}

/// A secret unfit to derive a migration key from.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// Too short.
    #[error("holds {0} bytes of secret; a migration key needs at least {MIN_SECRET} (`hover migration-key FILE` makes one)")]
    Short(usize),
    /// Too few different byte values to be random.
    #[error("its secret has only {0} different byte values, too few to be random: make a key with `hover migration-key FILE`")]
    NotRandom(usize),
}

/// A key file refused, naming it.
#[derive(Debug, thiserror::Error)]
#[error("migration key {path}: {problem}")]
pub struct KeyFileError {
    /// The file, as given.
    pub path: String,
    /// What is wrong with it.
    pub problem: KeyFileProblem,
}

/// What is wrong with a key file.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileProblem {
    /// It cannot be opened or read.
    #[error("{0}")]
    Io(std::io::Error),
    /// A directory, a FIFO, a device...
    #[error("not a regular file")]
    NotAFile,
    /// A file of procfs or sysfs.
    #[error("a file of {0}, not a key (`hover migration-key FILE` makes one)")]
    Pseudo(&'static str),
    /// Another user's file.
    #[error("owned by user {owner}, not by this user ({me})")]
    Owner {
        /// Its owner.
        owner: u32,
        /// This user.
        me: u32,
    },
    /// Others may read or change it.
    #[error("mode {mode:04o} lets others read or change it: chmod 600 {path}")]
    Mode {
        /// Its permission bits.
        mode: u32,
        /// The file, for the command that fixes it.
        path: String,
    },
    /// Larger than a key file can be.
    #[error("{0} bytes, over the {MAX_KEY_FILE}-byte limit of a key file")]
    TooLarge(u64),
    /// Its secret is unfit.
    #[error("{0}")]
    Secret(SecretError),
}

impl MigrationKey {
    /// A key from `secret` (surrounding white space does not count): at
    /// least [`MIN_SECRET`] bytes, of at least [`MIN_DISTINCT`] values.
    pub fn from_secret(secret: &[u8]) -> Result<MigrationKey, SecretError> {
        let s = secret.trim_ascii();
        if s.len() < MIN_SECRET {
            return Err(SecretError::Short(s.len()));
        }
        let mut seen = [false; 256];
        s.iter().for_each(|&b| seen[usize::from(b)] = true);
        let distinct = seen.iter().filter(|&&x| x).count();
        if distinct < MIN_DISTINCT {
            return Err(SecretError::NotRandom(distinct));
        }
        Ok(MigrationKey(blake3::derive_key(KEY_CONTEXT, s)))
    }

    /// Read the key file at `path`: a regular file of this user that no
    /// one else may read or write (mode 0600 or stricter).
    pub fn load(path: &Path) -> Result<MigrationKey, KeyFileError> {
        let err = |problem| KeyFileError {
            path: path.display().to_string(),
            problem,
        };
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)
            .map_err(|e| err(KeyFileProblem::Io(e)))?;
        let m = f.metadata().map_err(|e| err(KeyFileProblem::Io(e)))?;
        if !m.is_file() {
            return Err(err(KeyFileProblem::NotAFile));
        }
        if let Some(fs) = crate::host::files::pseudo_fs(&f) {
            return Err(err(KeyFileProblem::Pseudo(fs)));
        }
        // SAFETY: geteuid cannot fail.
        let me = unsafe { libc::geteuid() };
        if m.uid() != me {
            return Err(err(KeyFileProblem::Owner { owner: m.uid(), me }));
        }
        if m.mode() & 0o077 != 0 {
            return Err(err(KeyFileProblem::Mode {
                mode: m.mode() & 0o7777,
                path: path.display().to_string(),
            }));
        }
        if m.len() > MAX_KEY_FILE {
            return Err(err(KeyFileProblem::TooLarge(m.len())));
        }
        let mut secret = Vec::new();
        f.take(MAX_KEY_FILE)
            .read_to_end(&mut secret)
            .map_err(|e| err(KeyFileProblem::Io(e)))?;
        MigrationKey::from_secret(&secret).map_err(|e| err(KeyFileProblem::Secret(e)))
    }

    /// The derived key itself.
    pub(crate) fn secret(&self) -> &[u8; 32] {
        &self.0
    }

    /// Write a new random key to `path` (which must not exist), mode 0600:
    /// 64 hexadecimal digits and a newline.
    pub fn create(path: &Path) -> io::Result<()> {
        use std::io::Write;
        let mut raw = [0u8; 32];
        crate::host::random_bytes(&mut raw)?;
        let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)?;
        // Whatever the umask made of it, the file is the owner's only.
        f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
        writeln!(f, "{hex}")?;
        f.sync_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn key_files_are_checked() {
        let dir = std::env::temp_dir().join(format!("hover-key-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("k");
        let _ = std::fs::remove_file(&p);
        MigrationKey::create(&p).unwrap();
        let m = std::fs::metadata(&p).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o600);
        assert_eq!(m.len(), 65);
        let k = MigrationKey::load(&p).unwrap();
        assert_eq!(format!("{k:?}"), "MigrationKey(..)");
        assert!(MigrationKey::create(&p).is_err(), "never overwrites");
        // Two keys made apart differ.
        let q = dir.join("q");
        let _ = std::fs::remove_file(&q);
        MigrationKey::create(&q).unwrap();
        assert_ne!(MigrationKey::load(&q).unwrap().secret(), k.secret());
        // Readable by others: refused with the fix.
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = MigrationKey::load(&p).unwrap_err().to_string();
        assert!(e.contains("chmod 600"), "{e}");
        // Too short a secret.
        std::fs::write(&q, "short\n").unwrap();
        assert!(MigrationKey::load(&q)
            .unwrap_err()
            .to_string()
            .contains("at least 32"));
        // Not a regular file; a file of procfs; a secret of one byte.
        assert!(MigrationKey::load(&dir)
            .unwrap_err()
            .to_string()
            .contains("regular"));
        let environ = MigrationKey::load(Path::new("/proc/self/environ"))
            .unwrap_err()
            .to_string();
        assert!(environ.contains("procfs"), "{environ}");
        std::fs::write(&q, "0".repeat(64)).unwrap();
        assert!(MigrationKey::load(&q)
            .unwrap_err()
            .to_string()
            .contains("too few"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
