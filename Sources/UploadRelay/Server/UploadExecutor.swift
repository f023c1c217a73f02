import NIOCore
import UploadProtocol

/// Runs the storage steps of one upload (``UploadStorage/perform(_:)``), each as a task of the relay's, and hands each completion back
/// on the connection's event loop. It decides nothing: the steps come from the upload's ``UploadPipeline`` through the
/// ``RelaySession``, one at a time.
final class UploadExecutor {
    private let storage: UploadStorage
    private let executor: RelayExecutor
    private let eventLoop: any EventLoop
    /// Where each step's completion goes (the connection's session, through its handler).
    var onCompletion: (RelaySession.StorageCompletion) -> Void = { _ in }

    init(storage: UploadStorage, executor: RelayExecutor, eventLoop: any EventLoop) {
        self.storage = storage
        self.executor = executor
        self.eventLoop = eventLoop
    }

    func run(_ step: UploadPipeline.StorageStep) {
        let executor = NIOLoopBound(self, eventLoop: self.eventLoop)
        let (storage, eventLoop) = (self.storage, self.eventLoop)
        self.executor.task {
            let completion = await storage.perform(step)
            eventLoop.execute { executor.value.onCompletion(completion) }
        }
    }
}
