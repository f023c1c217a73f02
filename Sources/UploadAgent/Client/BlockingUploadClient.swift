import Logging
import NIOConcurrencyHelpers

/// ``UploadClient`` for callers without async/await: each call blocks the calling thread until it is done.
///
/// Call it from a thread of your own (a worker thread, `main` of a command-line tool), never from an event loop or a
/// Swift concurrency task, whose threads the upload itself needs.
public final class BlockingUploadClient: Sendable {
    public let client: UploadClient

    public init(configuration: AgentConfiguration, logger: Logger = Logger(label: "upload-agent")) {
        self.client = UploadClient(configuration: configuration, logger: logger)
    }

    /// Uploads `source` under `key`, calling `progress` (on another thread) as it moves; returns once the relay stored
    /// it. Throws ``UploadFailure`` when it did not.
    public func upload(
        _ source: any BlobSource, key: String, overwrite: Bool? = nil, dedup: Bool? = nil,
        progress: (@Sendable (UploadProgress) -> Void)? = nil
    ) throws -> UploadResult {
        let upload = self.client.upload(source, key: key, overwrite: overwrite, dedup: dedup)
        let result =
            Self.wait {
                for await step in upload.progress { progress?(step) }
                return await upload.outcome
            }
            ?? .failed(key: key, path: source.displayName, error: "no result")
        guard result.status != .failed else { throw UploadFailure(result: result) }
        return result
    }

    /// Ends the client: uploads still under way are cancelled.
    public func shutdown() throws {
        let client = self.client
        let outcome = Self.wait { () async -> Result<Void, any Error> in
            do {
                try await client.shutdown()
                return .success(())
            } catch {
                return .failure(error)
            }
        }
        try outcome?.get()
    }

    /// Runs `body` in a task and blocks this thread until it returned (nil only if the value went missing).
    private static func wait<T: Sendable>(_ body: @escaping @Sendable () async -> T) -> T? {
        let done = ConditionLock(value: 0)
        let box = NIOLockedValueBox<T?>(nil)
        Task {
            let value = await body()
            box.withLockedValue { $0 = value }
            done.lock()
            done.unlock(withValue: 1)
        }
        done.lock(whenValue: 1)
        done.unlock()
        return box.withLockedValue { $0 }
    }
}
