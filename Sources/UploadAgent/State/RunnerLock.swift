#if canImport(Glibc)
import Glibc
#endif
import UploadChecksums
import UploadProtocol

/// The lock that makes one process at a time the uploader of a target's queue: an `flock` on a file in the state
/// directory, released by the kernel when the process ends however it ends (`kill -9` included).
public final class RunnerLock: Sendable {
    private let descriptor: Int32
    public let path: String

    private init(descriptor: Int32, path: String) {
        self.descriptor = descriptor
        self.path = path
    }

    /// Takes the lock for `target` without waiting; nil when another process holds it.
    public static func tryAcquire(store: AgentStateStore, target: String) throws -> RunnerLock? {
        let name = Array(SHA1.hash(Array(target.utf8)).prefix(8)).hexString
        let path = store.directory + "/runner-\(name).lock"
        let fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            throw SourceError("cannot open the lock \(path): \(String(cString: strerror(errno)))")
        }
        guard flock(fd, LOCK_EX | LOCK_NB) == 0 else {
            close(fd)
            return nil
        }
        return RunnerLock(descriptor: fd, path: path)
    }

    deinit {
        close(self.descriptor)
    }
}
