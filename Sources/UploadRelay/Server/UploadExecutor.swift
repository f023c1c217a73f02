import NIOCore
import NIOPosix
import UploadProtocol

/// Runs the storage steps of one upload (``UploadStorage/perform(_:)``) on the I/O thread pool and hands each completion
/// back on the connection's event loop. It decides nothing: the steps come from the upload's ``UploadPipeline`` through
/// the ``RelaySession``.
final class UploadExecutor {
    private let storage: UploadStorage
    private let pool: NIOThreadPool
    private let eventLoop: any EventLoop
    /// Where each step's completion goes (the connection's session, through its handler).
    var onCompletion: (RelaySession.StorageCompletion) -> Void = { _ in }

    init(storage: UploadStorage, pool: NIOThreadPool, eventLoop: any EventLoop) {
        self.storage = storage
        self.pool = pool
        self.eventLoop = eventLoop
    }

    func run(_ step: UploadPipeline.StorageStep) {
        let (storage, eventLoop) = (self.storage, self.eventLoop)
        let executor = NIOLoopBound(self, eventLoop: eventLoop)
        let deliver: @Sendable (RelaySession.StorageCompletion) -> Void = { completion in
            eventLoop.execute { executor.value.onCompletion(completion) }
        }
        self.pool.submit { state in
            guard state == .active else {
                deliver(UploadStorage.notRun(step, NIOThreadPoolError.ThreadPoolInactive()))
                return
            }
            storage.perform(step, then: deliver)
        }
    }
}
