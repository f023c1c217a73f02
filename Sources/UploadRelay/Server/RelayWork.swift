import Logging
import NIOCore
import UploadChecksums
import UploadProtocol

/// A connection's catalog and store work, each run as a task and answered on the connection's event loop: the catalog
/// lookup of a credential, the lookup of an OPEN (with, for an upload, the executor of its storage), a PLAN's answer.
package struct RelayWork {
    let dependencies: RelayConnectionDependencies
    let eventLoop: any EventLoop

    /// The account the HELLO's token names, if any.
    func authenticate(_ hello: Frame.Hello, then answer: @escaping (Result<Account?, any Error>) -> Void) {
        let (catalog, hash) = (self.dependencies.policy.catalog, Tokens.hash(hello.credential))
        self.dependencies.executor.task(on: self.eventLoop) {
            try await catalog.account(tokenHash: hash)
        }.assumeIsolated().whenComplete(answer)
    }

    /// The relay's answer to OPEN by ``UploadPolicy``; for an upload, the executor that will run its storage steps
    /// (it holds the staging file and the SHA-1 state, which the session never sees).
    func lookUp(
        _ open: Frame.Open, _ key: ObjectKey, _ account: Account, logger: Logger,
        then answer: @escaping (RelaySession.LookUp, UploadExecutor?) -> Void
    ) {
        let (dependencies, eventLoop) = (self.dependencies, self.eventLoop)
        dependencies.executor.task(on: eventLoop) {
            await Self.lookUp(open, key, account, policy: dependencies.policy, storage: dependencies.storage, logger: logger)
        }.assumeIsolated().whenSuccess { looked in
            answer(looked.0, looked.1.map { UploadExecutor(storage: $0, executor: dependencies.executor, eventLoop: eventLoop) })
        }
    }

    /// The relay's answer to PLAN (SPEC §7.2), read from the catalog off the event loop.
    func plan(_ plan: Frame.Plan, _ account: Account, then answer: @escaping (Result<Frame.Room, UploadPolicy.Refusal>) -> Void) {
        let policy = self.dependencies.policy
        self.dependencies.executor.task(on: self.eventLoop) {
            await policy.plan(account: account, plan: plan)
        }.assumeIsolated().whenSuccess(answer)
    }

    /// The lookup itself: the session's answer and, for an upload, its storage.
    package static func lookUp(
        _ open: Frame.Open, _ key: ObjectKey, _ account: Account, policy: UploadPolicy, storage context: UploadStorage.Context,
        logger: Logger
    ) async -> (RelaySession.LookUp, UploadStorage?) {
        switch await policy.open(account: account, open: open, key: key) {
        case .stored(let size):
            return (.stored(size: size), nil)
        case .confirm:
            return (.confirm, nil)
        case .refuse(let code, let message):
            return (.refuse(code, message), nil)
        case .upload(let session, let staging, let sha1, let recorded, let resumed, let byteLimit):
            let storage = UploadStorage(
                key: key, account: account, overwrite: open.overwrite, session: session, recorded: recorded, staging: staging,
                sha1: sha1, context: context, logger: logger
            )
            let decision = RelaySession.LookUp.upload(
                durableOffset: session.durableOffset, resumeToken: session.resumeToken, resumed: resumed, byteLimit: byteLimit
            )
            return (decision, storage)
        case .stripe(let session, let staging, let index):
            let storage = UploadStorage(
                key: key, account: account, overwrite: false, session: session, recorded: true, staging: staging, sha1: SHA1(),
                context: context, logger: logger, stripe: index
            )
            return (.stripe, storage)
        }
    }
}
