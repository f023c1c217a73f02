import Foundation
import NIOConcurrencyHelpers

/// The temporary directories the tests make, removed when the test process exits, whether the tests passed
/// or failed (issue 6 finding 13). `tools/test` also runs everything under one temporary directory that it removes.
public enum TemporaryDirectories {
    private static let made = NIOLockedValueBox<[String]?>(nil)

    /// Records `path` for removal at exit.
    public static func removeAtExit(_ path: String) {
        let first = self.made.withLockedValue { made -> Bool in
            defer { made = (made ?? []) + [path] }
            return made == nil
        }
        if first {
            atexit {
                let paths = TemporaryDirectories.made.withLockedValue { $0 ?? [] }
                for path in paths { _ = try? FileManager.default.removeItem(atPath: path) }
            }
        }
    }

    /// A new empty directory under the temporary directory, removed at exit.
    public static func make(prefix: String = "upload-test-") -> String {
        let path = NSTemporaryDirectory() + prefix + UUID().uuidString
        try! FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        Self.removeAtExit(path)
        return path
    }
}
